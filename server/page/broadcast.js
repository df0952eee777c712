// A listener of a broadcast: Janus's janus.js watches the Streaming mountpoint the page's URL
// names (?mountpoint=ID&janus=URL, and #token=TOKEN where Janus takes tokens) and answers
// Janus's offer; meter.js plays and measures what it hears. The server is not in this path:
// Janus serves every listener.
"use strict";

// janus.js asks adapter.js which browser it runs in; Chromium's answers are what it needs.
const browserDetails = { browserDetails: { browser: "chrome", version: 120 } };

function listen() {
  document.getElementById("connect").disabled = true;
  const query = new URLSearchParams(location.search);
  const mountpoint = Number(query.get("mountpoint"));
  const server = query.get("janus");
  // A token for Janus's Streaming plugin where Janus takes tokens, in the fragment (which no
  // request carries), taken out of the address bar and the history.
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  speech.session = `mountpoint ${mountpoint}`;
  show("connecting to Janus");
  Janus.init({
    debug: false,
    dependencies: Janus.useDefaultDependencies({ adapter: browserDetails }),
    callback: () => {
      const janus = new Janus({
        server,
        token,
        success: () => watch(janus, mountpoint),
        error: (error) => show(`Janus: ${error}`),
      });
    },
  });
}

// Attaches to the Streaming plugin and watches `mountpoint`: Janus offers, the page answers,
// and the mountpoint's audio comes on the handle's peer connection.
function watch(janus, mountpoint) {
  let streaming = null;
  janus.attach({
    plugin: "janus.plugin.streaming",
    success: (handle) => {
      streaming = handle;
      show("watching");
      streaming.send({ message: { request: "watch", id: mountpoint } });
    },
    error: (error) => show(`Janus: ${error}`),
    onmessage: (message, jsep) => {
      if (message.error) show(`Janus: ${message.error}`);
      if (!jsep) return;
      streaming.createAnswer({
        jsep,
        // Receive only: the offer's audio, nothing sent back.
        tracks: [{ type: "data" }],
        success: (answer) => {
          peerConnection(streaming);
          streaming.send({ message: { request: "start" }, jsep: answer });
        },
        error: (error) => show(`answer: ${error}`),
      });
    },
    onremotetrack: (track, mid, on) => {
      if (!on || track.kind !== "audio") return;
      const pc = peerConnection(streaming);
      hear(pc.getReceivers().find((receiver) => receiver.track === track), new MediaStream([track]));
    },
  });
}

// The handle's peer connection (janus.js makes it while it answers), followed in the status.
function peerConnection(handle) {
  const pc = handle.webrtcStuff.pc;
  if (speech.pc !== pc) {
    speech.pc = pc;
    pc.onconnectionstatechange = () => show(pc.connectionState);
  }
  return pc;
}

document.getElementById("connect").onclick = listen;
