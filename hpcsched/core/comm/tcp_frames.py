"""The TCP framing, as a pure state machine: bytes in, messages (lists of frames) out.

Wire format of one message (all integers little-endian)::

    b"HSm1"  nframes:uint32  len_0:uint64 ... len_{n-1}:uint64  frame_0 ... frame_{n-1}

where the frames are :func:`hpcsched.core.protocol.serialize.dumps` of the message.

Rules of this module (it touches no socket, thread or clock, so it can be fed
any byte string in a test, like h11's protocol state machine):

* **Memory grows only as bytes arrive.** Small frames are parsed out of one
  reusable buffer: a page on the heap at first, which is all a connection that
  only carries small messages needs (a worker opens one to each peer it fetches
  from: no mapping to make and unmap for it); the first message that does not
  fit moves it to an anonymous ``mmap``, whose pages a burst committed
  beyond ``KEEP_COMMITTED`` are given back once the burst is parsed, so that a
  thousand mostly idle connections cost little. A large frame gets an anonymous
  ``mmap`` of its declared size: the kernel reserves address space but commits
  pages only when bytes are written into them, so a peer announcing a 1 GiB
  frame and sending nothing costs nothing. The frame's bytes are received straight into that mapping
  (:meth:`FrameDecoder.get_buffer`, in the manner of asyncio's
  ``BufferedProtocol``), and a numpy array unpickles on top of it: no copy.
* **Limits are checked when a header is read**, before anything is reserved:
  ``comm.max-frames`` frames per message and ``comm.max-frame-bytes`` per
  frame. A violation raises :class:`FrameError` naming the setting; the
  connection is then unusable (the stream has lost its framing).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence

MSG_MAGIC = b"HSm1"  # message magic; the last byte is the framing version
HEAD = struct.Struct("<4sI")
COPY_LIMIT = 64 * 1024  # frames up to this size are copied out of the receive buffer
BUFFER_SIZE = 256 * 1024  # the reusable receive buffer
START_SIZE = 4096  # ... until a message needs more: a page
KEEP_COMMITTED = 64 * 1024  # of it, the pages kept after a burst (the rest goes back)

_lengths_structs: dict[int, struct.Struct] = {}


class FrameError(ValueError):
    """A malformed or over-limit frame: the stream cannot be trusted any more."""


class FrameTooLarge(ValueError):
    """This process was asked to send a frame over its own ``comm.max-frame-bytes``."""


def lengths_struct(n: int) -> struct.Struct:
    s = _lengths_structs.get(n)
    if s is None:
        s = struct.Struct(f"<{n}Q")
        if n <= 64:
            _lengths_structs[n] = s
    return s


def frame_nbytes(frame: bytes | bytearray | memoryview) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


#: anonymous mappings private to this process: ``mmap.mmap(-1, n)`` alone maps shared
#: memory, whose pages ``MADV_DONTNEED`` only unmaps (RSS drops; the pages, and their
#: bytes, stay allocated in shared memory until the mapping is closed)
_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}


def _reserve(size: int) -> mmap.mmap | bytearray:
    """A buffer of ``size`` bytes whose pages are committed as they are written."""
    try:
        return mmap.mmap(-1, size, **_PRIVATE)
    except (OSError, ValueError):
        return bytearray(size)


def encode_header(lengths: Sequence[int], max_frames: int, max_frame_bytes: int) -> bytes:
    """The header of a message of frames of ``lengths``; checks this side's limits so a
    too-large message fails here, with a clear error, not at the receiver."""
    n = len(lengths)
    if n > max_frames:
        raise FrameTooLarge(f"a message of {n} frames exceeds comm.max-frames={max_frames}")
    for length in lengths:
        if length > max_frame_bytes:
            raise FrameTooLarge(
                f"a frame of {length} bytes exceeds comm.max-frame-bytes={max_frame_bytes}: "
                "raise that setting on both ends (e.g. HPCSCHED_COMM__MAX_FRAME_BYTES) or "
                "send the data in smaller pieces")
    return HEAD.pack(MSG_MAGIC, n) + lengths_struct(n).pack(*lengths)


class FrameDecoder:
    """Feed bytes (``get_buffer`` + ``buffer_updated``, or ``feed``); take messages.

    >>> d = FrameDecoder(max_frames=10, max_frame_bytes=100)
    >>> d.feed(encode_header([3], 10, 100) + b"abc" + MSG_MAGIC)
    >>> d.take(), d.in_message
    ([[b'abc']], True)
    """

    def __init__(self, max_frames: int, max_frame_bytes: int, buffer_size: int = BUFFER_SIZE):
        self.max_frames = max_frames
        self.max_frame_bytes = max_frame_bytes
        self._size = buffer_size
        self._buf: mmap.mmap | bytearray = bytearray(min(START_SIZE, buffer_size))
        self._view = memoryview(self._buf)
        self._start = 0  # unparsed bytes are _buf[_start:_end]
        self._end = 0
        self._high = 0  # the end of the bytes written since pages were last given back
        self._lengths: tuple[int, ...] | None = None  # of the message being read
        self._frames: list = []  # its frames so far
        self._big: mmap.mmap | None = None  # the large frame being received in place
        self._big_got = 0
        self._ready: list[list] = []

    # ------------------------------------------------------------ input
    @property
    def in_message(self) -> bool:
        """A message has started and is not complete (for the message timeout)."""
        return self._big is not None or self._lengths is not None or self._end > self._start

    def get_buffer(self) -> memoryview:
        """Where the next bytes should be written (never empty)."""
        if self._big is not None:
            return memoryview(self._big)[self._big_got:]
        if self._end == len(self._buf):
            self._compact(max(1, len(self._buf) - (self._end - self._start)))
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last :meth:`get_buffer`."""
        if self._big is not None:
            self._big_got += nbytes
            if self._big_got < len(self._big):
                return
            self._frames.append(self._big)
            self._big = None
            self._big_got = 0
        else:
            self._end += nbytes
        self._parse()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` in (for TLS plaintext and tests)."""
        view = memoryview(data).cast("B")
        while view.nbytes:
            buf = self.get_buffer()
            k = min(buf.nbytes, view.nbytes)
            buf[:k] = view[:k]
            view = view[k:]
            self.buffer_updated(k)

    def take(self) -> list[list]:
        """Complete messages so far, as lists of frames, oldest first."""
        out, self._ready = self._ready, []
        return out

    # ------------------------------------------------------------ parsing
    def _compact(self, need: int) -> None:
        """Make room for ``need`` contiguous bytes after the unparsed ones."""
        avail = self._end - self._start
        if avail + need > len(self._buf):
            # the first page is outgrown, or a header of many frames: grow (bounded by
            # comm.max-frames, checked first)
            new = _reserve(max(avail + need, 2 * len(self._buf), self._size))
            new[:avail] = self._view[self._start:self._end]
            self._buf, self._view = new, memoryview(new)
            self._high = avail
        elif self._start:
            self._view[:avail] = self._view[self._start:self._end]
            if self._end > self._high:
                self._high = self._end
        self._start, self._end = 0, avail

    def _give_back(self) -> None:
        """The buffer is empty after a burst: its pages past ``KEEP_COMMITTED`` go back to
        the kernel (they read as zeros when written again)."""
        buf = self._buf
        if isinstance(buf, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            start = KEEP_COMMITTED
            length = min(self._high, len(buf)) - start
            if length > 0:
                buf.madvise(mmap.MADV_DONTNEED, start, length)
        self._high = 0

    def _need(self, n: int) -> bool:
        if self._end - self._start >= n:
            return True
        if self._start + n > len(self._buf):
            self._compact(n - (self._end - self._start))
        return False

    def _parse(self) -> None:
        while True:
            if self._lengths is None:
                if not self._need(HEAD.size):
                    return
                magic, n = HEAD.unpack_from(self._buf, self._start)
                if magic != MSG_MAGIC:
                    raise FrameError(f"bad frame header (magic {bytes(magic)!r}): not an "
                                     "hpcsched peer or a corrupted stream")
                if n == 0 or n > self.max_frames:
                    raise FrameError(f"message announces {n} frames (limit "
                                     f"comm.max-frames={self.max_frames})")
                if not self._need(HEAD.size + 8 * n):
                    return
                lengths = lengths_struct(n).unpack_from(self._buf, self._start + HEAD.size)
                for length in lengths:
                    if length > self.max_frame_bytes:
                        raise FrameError(f"frame of {length} bytes announced (limit "
                                         f"comm.max-frame-bytes={self.max_frame_bytes})")
                self._start += HEAD.size + 8 * n
                self._lengths = lengths
                self._frames = []
            lengths = self._lengths
            while len(self._frames) < len(lengths):
                length = lengths[len(self._frames)]
                avail = self._end - self._start
                if length <= COPY_LIMIT:
                    if not self._need(length):
                        return
                    self._frames.append(bytes(self._view[self._start:self._start + length]))
                    self._start += length
                    continue
                # large: reserved, committed as bytes arrive, received in place
                try:
                    big = mmap.mmap(-1, length, **_PRIVATE)
                except (OSError, ValueError) as e:
                    raise FrameError(f"cannot reserve {length} bytes for a frame: {e}") from e
                got = min(avail, length)
                big[:got] = self._view[self._start:self._start + got]
                self._start += got
                if got < length:
                    self._big, self._big_got = big, got
                    return
                self._frames.append(big)
            self._ready.append(self._frames)
            self._frames = []
            self._lengths = None
            if self._start == self._end:
                if self._end > self._high:
                    self._high = self._end
                if self._high > KEEP_COMMITTED:
                    self._give_back()
                self._start = self._end = 0
