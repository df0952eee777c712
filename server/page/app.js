// The page's side of a session: signalling over a WebSocket to the server's peer connection
// (meter.js plays and measures what it hears).
"use strict";

// The join token that the application's backend signed for this listener, from the page's
// URL's fragment (#token=...), which no request sends on, neither to a server nor in a Referer
// (docs/streaming-server.md); taken out of the address bar and the history at once.
const joinToken = (() => {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (token) history.replaceState(null, "", location.pathname + location.search);
  return token;
})();

function connect() {
  document.getElementById("connect").disabled = true;
  // wss on an https page (behind a TLS proxy): a browser refuses ws from a secure page.
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  // /signal names the token's session as /codes does, for a router in front of several
  // servers.
  const token = joinToken;
  const session = token ? `?session=${encodeURIComponent(token.split(".")[0])}` : "";
  const socket = new WebSocket(`${scheme}://${location.host}/signal${session}`);
  const send = (message) => socket.send(JSON.stringify(message));
  // Made once the session message names the STUN and TURN servers; the offer and the server's
  // candidates come after it.
  let pc = null;

  socket.onopen = () => { show("joining"); send(token ? { type: "join", token } : { type: "join" }); };
  socket.onclose = (event) => {
    speech.closed = { code: event.code, reason: event.reason };
    show(`closed: ${event.code} ${event.reason}`);
  };
  socket.onmessage = async (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "session") {
      speech.session = message.id;
      pc = peerConnection(message.iceServers || [], send);
      show("negotiating");
    } else if (message.type === "offer") {
      await pc.setRemoteDescription({ type: "offer", sdp: message.sdp });
      const answer = await pc.createAnswer();
      await pc.setLocalDescription(answer);
      send({ type: "answer", sdp: answer.sdp });
    } else if (message.type === "sender") {
      speech.senders.push({ state: message.state, why: message.why || null, at: Date.now() });
    } else if (message.type === "ice") {
      await pc.addIceCandidate({ candidate: message.candidate, sdpMLineIndex: message.sdpMLineIndex });
    }
  };
}

// The session's peer connection, with the server's STUN and TURN servers: its candidates go to
// the server, its track to the <audio> element and the meter.
function peerConnection(iceServers, send) {
  const pc = new RTCPeerConnection({ iceServers });
  speech.pc = pc;
  pc.onicecandidate = (event) => {
    if (event.candidate && event.candidate.candidate) {
      send({ type: "ice", candidate: event.candidate.candidate, sdpMLineIndex: event.candidate.sdpMLineIndex });
    }
  };
  pc.onconnectionstatechange = () => show(pc.connectionState);
  pc.ontrack = (event) => hear(event.receiver, event.streams[0] || new MediaStream([event.track]));
  return pc;
}

document.getElementById("connect").onclick = connect;
