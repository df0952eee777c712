// The page's side of a session: signalling over a WebSocket, the remote audio played in the
// <audio> element, and a level meter from a Web Audio analyser. `window.speech` exposes what
// the meter sees and the inbound RTP statistics, for tests and for curious users.
"use strict";

const statusLine = document.getElementById("status");
const audio = document.getElementById("speech");
const meter = document.getElementById("meter");

const speech = {
  session: null,
  state: "not connected",
  // Analyser RMS above this is sound; a test may set it from the audio it sends.
  threshold: 0.01,
  rms: 0,
  // Changes between silence and sound: {at: Date.now(), sound: bool}.
  changes: [],
  // What the server said of the session's TTS sender: {state: "joined"|"left", why, at}.
  senders: [],
  // How the signalling connection closed: {code, reason}.
  closed: null,
  pc: null,
  // The inbound RTP audio statistics, or null before any.
  async inbound() {
    if (!speech.pc) return null;
    let found = null;
    (await speech.pc.getStats()).forEach((report) => {
      if (report.type === "inbound-rtp" && report.kind === "audio") found = report;
    });
    return found;
  },
};
window.speech = speech;

function show(state) {
  speech.state = state;
  statusLine.textContent = speech.session ? `session ${speech.session}: ${state}` : state;
}

function connect() {
  document.getElementById("connect").disabled = true;
  // wss on an https page (behind a TLS proxy): a browser refuses ws from a secure page.
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  // The join token that the application's backend signed for this listener, from the page's
  // URL (?token=...), where the server takes them (docs/streaming-server.md). /signal then names
  // the token's session as /codes does, for a router in front of several servers.
  const token = new URLSearchParams(location.search).get("token");
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
  pc.ontrack = (event) => {
    // The least jitter buffer the browser allows: on a loopback or LAN path the audio comes
    // evenly paced, and what the buffer holds still plays after a cancel.
    if ("jitterBufferTarget" in event.receiver) event.receiver.jitterBufferTarget = 0;
    const stream = event.streams[0] || new MediaStream([event.track]);
    audio.srcObject = stream;
    audio.play().catch(() => {});
    analyse(stream);
  };
  return pc;
}

// The meter: the RMS of the analyser's window, every 10 ms, and each change between silence
// and sound with its time.
function analyse(stream) {
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  analyser.fftSize = 1024;
  context.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  const draw = meter.getContext("2d");
  let sound = false;
  setInterval(() => {
    if (context.state === "suspended") context.resume();
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const sample of samples) sum += sample * sample;
    speech.rms = Math.sqrt(sum / samples.length);
    if ((speech.rms > speech.threshold) !== sound) {
      sound = !sound;
      speech.changes.push({ at: Date.now(), sound });
    }
    draw.clearRect(0, 0, meter.width, meter.height);
    draw.fillStyle = sound ? "#2a7" : "#bbb";
    draw.fillRect(0, 0, Math.min(1, speech.rms * 3) * meter.width, meter.height);
  }, 10);
}

document.getElementById("connect").onclick = connect;
