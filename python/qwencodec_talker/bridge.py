"""One utterance of a `qwencodec_talker.speech.Speaker`, spoken in a thread, heard in asyncio.

`Speaker.speak` blocks while the talker runs; an `Utterance` runs it in a thread of its own and
hands each decode step's audio to the event loop through an asyncio queue, so the loop never
waits on the talker. Barge-in is its `cancel` event: the talker stops before its next step and
the decoder drops what it holds. Both framework integrations (pipecat_qwencodec,
livekit.plugins.qwencodec) speak through it and differ only in how their framework starts,
orders and interrupts utterances.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

_END = object()


@dataclass(eq=False)
class Utterance:
    """`speaker.speak(text, cancel=self.cancel, **options)`, once, after `after` (the utterance
    before it on the same Speaker, if any) has ended; what it made is filled in by its thread."""

    speaker: Any = field(repr=False)
    text: str = ""
    options: dict[str, Any] = field(default_factory=dict, repr=False)
    after: Utterance | None = field(default=None, repr=False)
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    frames_made: int = 0  # the talker's frames decoded (Speaker.frames_made)
    cancelled: bool = False  # ended by cancel, not by the talker's EOS or max_new_tokens
    first_audio_s: float | None = None  # from `audio()` to its first audio, in the thread
    error: BaseException | None = None
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _ended: asyncio.Future | None = field(default=None, init=False, repr=False)

    async def audio(self) -> AsyncIterator[bytes]:
        """Speaks in a thread and yields each decode step's audio (S16LE mono) as it comes;
        raises the Speaker's error. Leaving early (closed or cancelled) sets `cancel`; `finish`
        waits for the thread to end."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()
        ended = self._ended = loop.create_future()
        started = time.monotonic()

        def hand(item):
            try:
                loop.call_soon_threadsafe(chunks.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody is listening
                self.cancel.set()

        def work():
            try:
                # Speaker.frames_made belongs to its last speak: the one before must be over.
                if self.after is not None:
                    self.after.join()
                    self.after = None
                if self.cancel.is_set():
                    self.cancelled = True
                else:
                    self._speak(hand, started)
                hand(_END)
            except BaseException as error:  # handed to the consumer
                self.error = error
                hand(error)
            finally:
                try:
                    loop.call_soon_threadsafe(ended.set_result, None)
                except RuntimeError:
                    pass

        self._thread = threading.Thread(target=work, name="qwencodec-utterance", daemon=True)
        self._thread.start()
        over = False
        try:
            while True:
                item = await chunks.get()
                if item is _END:
                    over = True
                    return
                if isinstance(item, BaseException):
                    over = True
                    raise item
                yield item
        finally:
            if not over:
                self.cancel.set()

    def _speak(self, hand, started):
        audio = self.speaker.speak(self.text, cancel=self.cancel, **self.options)
        try:
            for chunk in audio:
                if self.first_audio_s is None:
                    self.first_audio_s = time.monotonic() - started
                hand(chunk)
        finally:
            audio.close()
            self.frames_made = self.speaker.frames_made
            self.cancelled = self.cancel.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Blocks until the thread has ended (True) or `timeout`; unstarted, until `after` has."""
        if self._thread is None:
            return True if self.after is None else self.after.join(timeout)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    async def finish(self) -> None:
        """Sets `cancel` and waits for the thread to end, even when this task is cancelled
        meanwhile (the last cancellation is raised after)."""
        self.cancel.set()
        if self._ended is None:
            return
        cancelled = None
        while not self._ended.done():
            try:
                await asyncio.shield(self._ended)
            except asyncio.CancelledError as error:
                cancelled = error
        if cancelled is not None:
            raise cancelled
