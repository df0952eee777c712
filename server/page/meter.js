// What a page hears, for both pages (index.html's session, broadcast.html's broadcast): the
// remote audio played in the <audio> element, a level meter from a Web Audio analyser, and
// `window.speech`, which exposes what the meter sees and the inbound RTP statistics, for tests
// and for curious users.
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

// A track received on `receiver`: played, and measured by the meter.
function hear(receiver, stream) {
  // The least jitter buffer the browser allows: on a loopback or LAN path the audio comes
  // evenly paced, and what the buffer holds still plays after a cancel.
  if ("jitterBufferTarget" in receiver) receiver.jitterBufferTarget = 0;
  audio.srcObject = stream;
  audio.play().catch(() => {});
  analyse(stream);
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
