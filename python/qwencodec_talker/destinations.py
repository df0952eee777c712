"""Where the command line's frames go: raw codes to a file or standard output, the media
server's `/codes` WebSocket (its frames in messages, or as RTP to the port it names), or RTP
to a host and port. Each takes `send(frame)`, then `end()` (the utterance is complete) or
`cancel()` (barge-in: what was sent and not yet heard is dropped where the receiver can), then
`close()`.
"""

import base64
import json
import time
from urllib.parse import parse_qs, urlsplit

from .pipeline import CodesPipeline, load_plugin, pack

# Five times the server's RTP jitter-buffer latency (docs/server-protocol.md, codes over RTP).
RTP_SETTLE_S = 0.2
# The SRTP suite the media server offers (srtp=1), and srtpenc's names for it.
SRTP_SUITE = "AES_CM_128_HMAC_SHA1_80"
SRTPENC = ("srtpenc name=srtp rtp-cipher=aes-128-icm rtp-auth=hmac-sha1-80 "
           "rtcp-cipher=aes-128-icm rtcp-auth=hmac-sha1-80")


class RawCodes:
    """S16LE codes, frame-major, flushed frame by frame (for fdsrc ! ... ! qwencodecdec)."""

    def __init__(self, file):
        self.file = file

    def send(self, frame):
        self.file.write(pack(frame))
        self.file.flush()

    def end(self):
        pass

    def cancel(self):
        pass

    def close(self):
        self.file.close()


class Rtp(CodesPipeline):
    """appsrc ! rtpqwencodespay ! udpsink: the payloader marks the utterance's first packet;
    `end` drains it (the next run's frames start a new utterance). With `srtp_key` (the master
    key and salt of SRTP_SUITE) the packets are SRTP: `rtpqwencodespay ! srtpenc ! udpsink`."""

    def __init__(self, host, port, plugin_dir=None, srtp_key=None):
        properties = {"net": {"host": host, "port": int(port)}}
        srtp = ""
        if srtp_key is not None:
            # srtpenc does not start without its key.
            srtp = f"{SRTPENC} ! "
            properties["srtp"] = {"key": load_plugin(plugin_dir).Buffer.new_wrapped(srtp_key)}
        super().__init__(f"rtpqwencodespay ! {srtp}udpsink name=net sync=false", properties=properties,
                         plugin_dir=plugin_dir, what="the RTP pipeline")

    def send(self, frame):
        self.push(frame)

    def end(self):
        # EOS sends what the payloader holds and waits until the last packet is out.
        self.appsrc.emit("end-of-stream")
        self.bus.timed_pop_filtered(5 * self.Gst.SECOND,
                                    self.Gst.MessageType.EOS | self.Gst.MessageType.ERROR)

    def cancel(self):
        pass


def srtp_key_of(offer):
    """The SRTP key of the server's first message, if it gives one (bytes)."""
    srtp = offer.get("srtp")
    if srtp is None:
        return None
    if srtp.get("suite") != SRTP_SUITE:
        raise RuntimeError(f"the server's SRTP suite is {srtp.get('suite')!r}; this talker sends {SRTP_SUITE}")
    return base64.b64decode(srtp["key"])


class Server:
    """The media server's `/codes?session=ID` (qwencodec-server, docs/server-protocol.md): the
    frames as binary messages, or with `transport=rtp` in the URL as RTP packets to the port the
    server's first message names (SRTP of the key it gives, with `srtp=1` in the URL too); `end`
    and `cancel` go on the WebSocket either way."""

    def __init__(self, url, token, plugin_dir=None):
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ws = connect(url, additional_headers=headers, open_timeout=10)
        self.rtp = None
        if parse_qs(urlsplit(url).query).get("transport") == ["rtp"]:
            offer = json.loads(self.ws.recv(timeout=10))
            if offer.get("type") != "rtp":
                raise RuntimeError(f"the server's first message is not an RTP port: {offer}")
            host = self.ws.remote_address[0]
            self.rtp = Rtp(host, offer["port"], plugin_dir=plugin_dir, srtp_key=srtp_key_of(offer))

    def send(self, frame):
        if self.rtp is not None:
            self.rtp.send(frame)
        else:
            self._ws_send(pack(frame))

    def _ws_send(self, message):
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(message)
        except ConnectionClosed as closed:
            why = closed.rcvd
            raise RuntimeError(f"the server closed /codes: {why.code} {why.reason}" if why
                               else "the connection to the server broke") from None

    def end(self):
        if self.rtp is not None:
            self.rtp.end()
            # The server's end goes straight to the session, while the last packets still wait
            # in its jitter buffer (40 ms): an end before them would start them as new speech.
            time.sleep(RTP_SETTLE_S)
        self._ws_send(json.dumps({"type": "end"}))

    def cancel(self):
        self._ws_send(json.dumps({"type": "cancel"}))

    def close(self):
        if self.rtp is not None:
            self.rtp.close()
        self.ws.close()
