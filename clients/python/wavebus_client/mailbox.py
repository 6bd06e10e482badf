"""The agent's shared-memory mailbox: a seqlock ring of the latest wave vectors.

The agent writes it; the client maps it and reads it with struct, so the per-step check costs no
system call. The client writes one word, capture_waiting. Layout (little-endian), fixed by
docs/native.md / src/client/mailbox.ts:

  header (64 bytes): magic b"WBMBOX01", u32 version=2, u32 slots=8, u64 features, u64 epoch,
                     u32 published (bumped by the writer after every slot write; a futex word), u32 0,
                     u64 floor (every wave below it is decided), u64 owner,
                     u64 capture_waiting (the client's: the before_forward ticket it waits on)
  slot i at 64 + 64*i (64 bytes): u64 seq (odd while written), u64 wave,
                                   u32 config_due, u32 dump_due, u32 snapshot_due, 0-pad
  the slot of wave N is N % slots; it belongs to wave N only if its wave field equals N.
  A slot with seq == 0 or wave == 2**64-1 is empty.
  Vectors are published one wave ahead (docs/architecture.md, "Waves"). A wave below the floor whose
  slot does not hold it has nothing due; the writer stores a slot before the floor that covers it,
  so the reader loads the floor first.
"""
import ctypes
import ctypes.util
import mmap
import os
import platform
import struct
import time
from typing import NamedTuple, Optional, Union

from .errors import ProtocolError

MAGIC = b"WBMBOX01"
VERSION = 2
SLOTS = 8
HEADER_SIZE = 64
SLOT_SIZE = 64
SIZE = HEADER_SIZE + SLOTS * SLOT_SIZE
EMPTY_WAVE = (1 << 64) - 1

FEATURE_BUS = 1 << 0
FEATURE_HOT_RELOAD = 1 << 1
FEATURE_DETECTORS = 1 << 2
FEATURE_SNAPSHOTS = 1 << 3
FEATURE_LIVE_CAPTURES = 1 << 4  # a capture armed on the running job is in force (docs/control.md)
FEATURE_RECORDER = 1 << 5  # the flight recorder is on: before_forward copies the inputs into its ring (docs/recorder.md)
FEATURE_HEADS = 1 << 6  # wake on demand: this rank heads its replica and something is armed: send wave heads (docs/control.md)
FEATURE_RANK_DIGEST = 1 << 7  # rank_divergence is on: decided()/decided_inputs() write the decision ring (digest.py)

_HEADER = struct.Struct("<8sIIQQ")  # magic, version, slots, features, epoch
_FEATURES = struct.Struct("<Q")
_FEATURES_OFFSET = 16
_SEQ = struct.Struct("<Q")
_SLOT = struct.Struct("<QQIII")  # seq, wave, config_due, dump_due, snapshot_due
_PUBLISHED = struct.Struct("<I")
_PUBLISHED_OFFSET = 32
_FLOOR = struct.Struct("<Q")
_FLOOR_OFFSET = 40
# The one word the client writes: the before_forward ticket it waits on, 0 when none (docs/snapshots.md).
_CAPTURE_WAITING_OFFSET = 56
# The same fields as 8-byte words (the mapping viewed as u64, see Mailbox._q): the per-step wave
# check indexes them directly, no struct call and no object per load.
_Q_FEATURES, _Q_EPOCH, _Q_FLOOR = _FEATURES_OFFSET // 8, 24 // 8, _FLOOR_OFFSET // 8
_Q_SLOT0, _Q_SLOT = HEADER_SIZE // 8, SLOT_SIZE // 8  # slot i's seq word; its wave word follows;
# then config_due | dump_due << 32 in one word, snapshot_due in the low half of the next
_U32 = 0xFFFFFFFF
# Slot i's seq word (the inlined per-step reads: one index instead of the arithmetic); SLOTS is a
# power of two, so a wave's slot is wave & (SLOTS - 1).
_SLOT_AT = tuple(_Q_SLOT0 + _Q_SLOT * i for i in range(SLOTS))
assert SLOTS & (SLOTS - 1) == 0

# futex(2) through libc's syscall(): the writer wakes the `published` word after every slot write.
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_PROT_READ, _MAP_SHARED = 0x1, 0x01


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_LIBC = []  # loaded once: [libc] or [None]


def _libc():
    """libc with syscall/mmap/munmap typed, or None where futex waiting is not available."""
    if not _LIBC:
        libc = None
        if _SYS_FUTEX is not None:
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                libc.syscall.restype = ctypes.c_long
                libc.mmap.restype = ctypes.c_void_p
                libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
                libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            except OSError:
                libc = None
        _LIBC.append(libc)
    return _LIBC[0]

# A writer holds a slot odd only for a few stores; bound the spin so a writer that died
# mid-write cannot hang the engine (the caller then treats the wave as not arrived).
_MAX_SPINS = 1000


class WaveVector(NamedTuple):
    """One wave's vector (immutable; a tuple, so that the per-step check makes it in one call)."""
    wave: int
    config_due: bool
    dump_due: bool
    snapshot_due: bool

    # True when no slot held the wave and the floor said nothing is due (the wave is below it).
    implied: bool = False

    @property
    def anything_due(self) -> bool:
        return self.config_due or self.dump_due or self.snapshot_due


class Mailbox:
    """View of one mailbox file. Reads are plain memory loads (no system call); the one store is
    capture_waiting (set_capture_waiting)."""

    def __init__(self, path: str):
        self.path = path
        self._futex_map = self._q = None
        # The last nothing-due vector read (immutable): the step's reads of one wave (before_forward,
        # end_of_wave) share it instead of building a tuple each.
        self._nd = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # the agent never makes it a link
        except FileNotFoundError:
            raise ProtocolError(f"mailbox {path} does not exist (is the wavebus agent of this rank running?)", "ERR_MAILBOX_MISSING") from None
        except OSError as e:
            raise ProtocolError(f"mailbox {path}: cannot open ({e.strerror})", "ERR_MAILBOX") from None
        try:
            size = os.fstat(fd).st_size
            if size < SIZE:
                raise ProtocolError(f"mailbox {path}: {size} bytes, expected at least {SIZE}", "ERR_MAILBOX_FORMAT")
            self._map = mmap.mmap(fd, SIZE, access=mmap.ACCESS_WRITE)
            # The header and slots as u64 words: the hot reads (features, floor, a slot) are one index each.
            self._q = memoryview(self._map).cast("Q")
            self._map_futex_word(fd)
        finally:
            os.close(fd)
        magic, version, slots, _features, _epoch = _HEADER.unpack_from(self._map, 0)
        if magic != MAGIC:
            self.close()
            raise ProtocolError(f"mailbox {path}: bad magic {magic!r}, expected {MAGIC!r}", "ERR_MAILBOX_FORMAT")
        if version != VERSION:
            self.close()
            raise ProtocolError(f"mailbox {path}: version {version} is not supported (this client reads {VERSION})", "ERR_MAILBOX_FORMAT")
        if slots != SLOTS:
            self.close()
            raise ProtocolError(f"mailbox {path}: {slots} slots, expected {SLOTS}", "ERR_MAILBOX_FORMAT")

    def _map_futex_word(self, fd: int) -> None:
        # Python's read-only mmap does not expose its address, so the header page is mapped once more
        # through libc (read-only, same file: the same futex). Without libc or a known futex number,
        # can_wait is False and the client asks the agent instead.
        libc = _libc()
        if libc is None:
            return
        addr = libc.mmap(None, SIZE, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return
        self._futex_map = addr

    def set_capture_waiting(self, ticket: int) -> None:
        """Say which before_forward this client waits on (a ticket > 0), or none (0): set before the
        request, cleared before the engine may touch its inputs again. The agent keeps a capture only
        if the word still holds its ticket once the inputs are copied. One aligned 8-byte store (a
        ctypes view made and dropped at once, so close() finds no exported buffer); x86-64 keeps it
        ordered before the engine's later stores."""
        if self._map is not None:
            ctypes.c_uint64.from_buffer(self._map, _CAPTURE_WAITING_OFFSET).value = ticket

    @property
    def can_wait(self) -> bool:
        """True when wait_wave sleeps on the futex (Linux x86-64 / aarch64 with libc)."""
        return self._futex_map is not None and self._map is not None

    def wait_wave(self, wave: int, timeout_s: float) -> Union[WaveVector, str]:
        """Sleep until ``wave``'s vector is published, at most ``timeout_s``: the vector, "timeout", or
        "overwritten" (its slot already holds a later wave). Needs can_wait. The GIL is released while
        asleep (ctypes), and the writer's wake ends the sleep at once: no polling, no request."""
        if not self.can_wait:
            raise ProtocolError(f"mailbox {self.path}: waiting needs futex(2) through libc", "ERR_MAILBOX")
        deadline = time.monotonic() + timeout_s
        word = ctypes.c_void_p(self._futex_map + _PUBLISHED_OFFSET)
        ts = _Timespec()
        while True:
            seen = _PUBLISHED.unpack_from(self._map, _PUBLISHED_OFFSET)[0]
            got = self._lookup(wave)
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ts.tv_sec, ts.tv_nsec = int(left), int((left - int(left)) * 1e9)
            # Returns at once if `published` moved since `seen` (EAGAIN): the loop looks again.
            _libc().syscall(ctypes.c_long(_SYS_FUTEX), word, ctypes.c_long(_FUTEX_WAIT), ctypes.c_long(seen), ctypes.byref(ts), None, ctypes.c_long(0))

    @classmethod
    def wait_open(cls, path: str, timeout_s: float) -> "Mailbox":
        """Open, retrying while the file is missing or its header not yet written (agent starting)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(path)
            except ProtocolError as e:
                if time.monotonic() >= deadline:
                    raise ProtocolError(f"{e} (waited {timeout_s:g} s)", e.code) from None
                time.sleep(0.02)

    @property
    def features(self) -> int:
        q = self._q
        return 0 if q is None else q[_Q_FEATURES]

    @property
    def epoch(self) -> int:
        return self._q[_Q_EPOCH]

    @property
    def floor(self) -> int:
        """Waves below this need no vector (0: none yet)."""
        q = self._q
        return 0 if q is None else q[_Q_FLOOR]

    def read_slot(self, index: int) -> Optional[WaveVector]:
        """A consistent copy of slot ``index``; None if empty or the writer kept it busy (never blocks)."""
        q = self._q
        if q is None:
            return None
        at = _Q_SLOT0 + _Q_SLOT * index
        for _ in range(_MAX_SPINS):
            # seq, the fields, then seq again: word loads in program order (x86-64 keeps loads ordered).
            s1 = q[at]
            if s1 & 1:
                continue
            wave, cd, sd = q[at + 1], q[at + 2], q[at + 3]
            if q[at] == s1:
                if s1 == 0 or wave == EMPTY_WAVE:
                    return None
                return WaveVector(wave, bool(cd & _U32), bool(cd >> 32), bool(sd & _U32))
        return None

    def _lookup(self, wave: int) -> Union[WaveVector, str, None]:
        """The vector of ``wave``, an implied nothing-due one (below the floor, not in its slot),
        "overwritten" (its slot holds a later wave), or None (not yet)."""
        q = self._q
        if q is None:
            return None
        floor = q[_Q_FLOOR]  # first: a slot the floor covers was written before it
        at = _Q_SLOT0 + _Q_SLOT * (wave % SLOTS)
        # The usual step inline (read_slot's loads, without its loop and calls): the slot holds the
        # wave, not being written, unchanged across the loads.
        s1 = q[at]
        if not s1 & 1 and s1 != 0:
            held, cd, sd = q[at + 1], q[at + 2], q[at + 3]
            if q[at] == s1 and held == wave:
                if not cd and not sd & _U32:
                    nd = self._nd
                    if nd is None or nd[0] != wave:
                        nd = self._nd = WaveVector(wave, False, False, False)
                    return nd
                return WaveVector(wave, bool(cd & _U32), bool(cd >> 32), bool(sd & _U32))
        v = self.read_slot(wave % SLOTS)
        if v is not None and v.wave == wave:
            return v
        if v is not None and v.wave > wave:
            return "overwritten"
        if wave < floor:
            return WaveVector(wave, False, False, False, implied=True)
        return None

    def no_dump_due(self, first: int, last: int) -> bool:
        """True when the slot of every wave in first..last holds that wave, read consistently, with
        dump_due 0: what read_wave would say of each (a vector without dump_due), in word loads only
        (the per-step pending_dump check). False means "look wave by wave" (read_wave)."""
        q = self._q
        if q is None:
            return False
        for wave in range(first, last + 1):
            at = _Q_SLOT0 + _Q_SLOT * (wave % SLOTS)
            s1 = q[at]
            if s1 & 1 or s1 == 0 or q[at + 1] != wave or q[at + 2] >> 32 or q[at] != s1:
                return False
        return True

    def read_wave(self, wave: int) -> Optional[WaveVector]:
        """The vector of ``wave`` if it has arrived (its slot holds that wave), an implied nothing-due
        vector if the wave is below the floor and its slot does not hold it, else None."""
        v = self._lookup(wave)
        return v if isinstance(v, WaveVector) else None

    def close(self) -> None:
        q, self._q = getattr(self, "_q", None), None
        if q is not None:
            q.release()  # an exported view would keep the mmap from closing
        m, self._map = getattr(self, "_map", None), None
        if m is not None:
            m.close()
        f, self._futex_map = getattr(self, "_futex_map", None), None
        if f is not None:
            _libc().munmap(f, SIZE)


class MailboxWriter:
    """The writer side of the layout, for tests and tools. In a job the agent is the only writer."""

    def __init__(self, path: str, features: int = 0, epoch: int = 1):
        self.path = path
        # A new file of ours, 0600 like the agent's (docs/security.md): never through a link.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self._map[:SIZE] = bytes(SIZE)
        for i in range(SLOTS):
            _SLOT.pack_into(self._map, HEADER_SIZE + SLOT_SIZE * i, 2, EMPTY_WAVE, 0, 0, 0)
        _HEADER.pack_into(self._map, 0, MAGIC, VERSION, SLOTS, features, epoch)  # magic last: header valid

    def set_features(self, features: int) -> None:
        _FEATURES.pack_into(self._map, _FEATURES_OFFSET, features)

    def begin(self, wave: int) -> int:
        """Start writing the slot of ``wave`` (seq goes odd); returns the slot offset."""
        off = HEADER_SIZE + SLOT_SIZE * (wave % SLOTS)
        seq = _SEQ.unpack_from(self._map, off)[0]
        _SEQ.pack_into(self._map, off, seq + 1 if seq % 2 == 0 else seq)
        return off

    @classmethod
    def attach(cls, path: str) -> "MailboxWriter":
        """Write into an existing mailbox without resetting it (tests that play the agent's part)."""
        w = cls.__new__(cls)
        w.path = path
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            w._map = mmap.mmap(fd, SIZE, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        return w

    def publish(self, wave: int, config_due: int = 0, dump_due: int = 0, snapshot_due: int = 0, floor: Optional[int] = None) -> None:
        off = self.begin(wave)
        seq = _SEQ.unpack_from(self._map, off)[0]
        _SLOT.pack_into(self._map, off, seq, wave, int(config_due), int(dump_due), int(snapshot_due))
        _SEQ.pack_into(self._map, off, seq + 1)
        if floor is not None:
            _FLOOR.pack_into(self._map, _FLOOR_OFFSET, floor)  # after the slot it covers
        self._announce()

    def set_floor(self, floor: int) -> None:
        _FLOOR.pack_into(self._map, _FLOOR_OFFSET, floor)
        self._announce()

    def _announce(self) -> None:
        """Bump `published` and wake readers asleep on it, as the agent's writer does."""
        n = _PUBLISHED.unpack_from(self._map, _PUBLISHED_OFFSET)[0]
        _PUBLISHED.pack_into(self._map, _PUBLISHED_OFFSET, (n + 1) & 0xFFFFFFFF)
        libc = _libc()
        if libc is not None:
            word = ctypes.c_char.from_buffer(self._map, _PUBLISHED_OFFSET)
            libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.byref(word), ctypes.c_long(_FUTEX_WAKE), ctypes.c_long(0x7FFFFFFF), None, None, ctypes.c_long(0))
            del word  # a live ctypes view would keep the mmap from closing

    def close(self) -> None:
        self._map.close()
