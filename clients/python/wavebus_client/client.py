"""The engine-side client of a rank's wavebus agent.

Thin by design: with everything off it sends nothing and does nothing per step. The per-step
check (end_of_wave) reads the agent's shared-memory mailbox; the agent is asked only when this
rank has work in that wave, and never waited on beyond the configured bound.

Not thread-safe: call it from the engine's step thread only.
"""
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Dict, Optional

from . import mailbox as mb
from . import wavebus_pb2 as pb
from .fault_file import disable_fault_file, enable_fault_file, pid_namespace
from .fingerprint import client_fingerprint
from .availability import Availability
from .digest import DigestMixin
from .errors import AgentError, AgentUnavailableError, ConfigError, ProtocolError
from .snapshot_select import CallCounter, SnapshotPrecheck
from .features import DEFAULT_END_OF_WAVE_TIMEOUT_MS, Features
from .live_capture import CaptureMixin
from .protocol import CLIENT_PROTOCOL_VERSION, protocol_mismatch
from .region import Region
from .registration import RegionsMixin
from .transport import AgentSocket
from .paths import env_paths
from .pending import PendingDumps, VectorStall, due_dumps_asker
from .tensor_head import TensorHeadMixin
from .wave_head import _MAX_U64, WaveHeadBuilder, check_wave

log = logging.getLogger("wavebus_client")
# The per-step calls' constants as module globals (one load each, no attribute lookup).
_BUS, _SENDS, _Q_FEATURES = mb.FEATURE_BUS, mb.FEATURE_BUS | mb.FEATURE_HEADS, mb._Q_FEATURES


@dataclass
class EndOfWaveResult:
    wave: int
    sent: bool = False          # the agent was asked (something due, or the wave had not arrived)
    timed_out: bool = False     # the wave vector / the agent's answer did not come within the bound
    dumps_written: int = 0
    vector: Optional[mb.WaveVector] = None
    error: str = ""


class Client(RegionsMixin, CaptureMixin, DigestMixin, TensorHeadMixin):
    """Use ``Client.connect()``; see docs/python-client.md."""

    def __init__(self, endpoint: str, mailbox_path: str, *, async_scheduling: bool = False,
                 hello_timeout_ms: int = 1000, capture_timeout_ms: int = 120000,
                 end_of_wave_margin_ms: int = 20, mailbox_wait_s: float = 10.0,
                 call_timeout_ms: Optional[int] = None, probe_interval_ms: int = 1000, engine_version: str = ""):
        for name, v in (("hello_timeout_ms", hello_timeout_ms), ("capture_timeout_ms", capture_timeout_ms),
                        ("end_of_wave_margin_ms", end_of_wave_margin_ms), ("probe_interval_ms", probe_interval_ms),
                        ("call_timeout_ms", 1 if call_timeout_ms is None else call_timeout_ms)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"Client.connect(): {name} must be a non-negative integer, got {v!r}")
        if not isinstance(endpoint, str) or "://" not in endpoint:
            raise ConfigError(f"Client.connect(): endpoint must be a ZeroMQ address like ipc:///run/x.sock, got {endpoint!r}")
        self.endpoint = endpoint
        self.mailbox_path = mailbox_path
        self.async_scheduling = bool(async_scheduling)
        # The engine's last wave_head and end_of_wave waves: which wave a forward belongs to.
        self._head_wave = 0
        self._ended_wave = 0
        # The last before_forward ticket (live_capture.py): random start, so a restarted client's differ.
        self._capture_ticket = random.randrange(1, 2**40)
        self.hello_timeout_ms = hello_timeout_ms
        self.capture_timeout_ms = capture_timeout_ms
        self.end_of_wave_margin_ms = end_of_wave_margin_ms
        self.call_timeout_ms = call_timeout_ms
        self.probe_interval_ms = probe_interval_ms
        if not isinstance(engine_version, str):
            raise ConfigError(f"Client.connect(): engine_version must be a string, got {engine_version!r}")
        self.engine_version = engine_version
        self._fingerprint = None  # taken at the first hello (the engine has loaded torch and its device by then)
        self.stats: Dict[str, int] = {
            "requests_sent": 0, "end_of_wave_fast": 0, "end_of_wave_waited": 0, "end_of_wave_sent": 0, "end_of_wave_timeouts": 0,
            "end_of_wave_errors": 0, "wave_head_sent": 0, "wave_head_errors": 0, "wave_head_skipped": 0,
            "stale_replies": 0, "bad_replies": 0, "captures": 0, "forwards_not_offered": 0, "register_errors": 0,
            "agent_lost": 0, "agent_back": 0, "skipped_unavailable": 0, "snapshots_skipped": 0, "probes": 0,
            "late_vectors": 0, "due_dumps_asked": 0, "stalled_skips": 0, "coordinator_lost": 0,
        }
        self._sock = AgentSocket(endpoint, self.stats, lambda: self._avail.heard())
        self._avail = Availability(endpoint, self.stats, probe_interval_ms, self._ping, self._sock.drain, self._agent_back)
        self.agent_features: Optional[Features] = None
        self._regions: Dict[str, Region] = {}
        self._sent_regions: Dict[str, Region] = {}
        self._head = WaveHeadBuilder()
        self._ring_request: Dict[str, int] = {}  # tensor_batch(): the ring asked for at hello
        self._ring_path, self._ring = "", None
        self._closed = False
        self._rec, self._recorder_path = None, ""  # the flight recorder's ring (live_capture.py)
        self.fault_file = ""  # what enable_fault_file did at the last hello (fault_file.py)
        self._mb = mb.Mailbox.wait_open(mailbox_path, mailbox_wait_s)
        self._stall = VectorStall(lambda: self._mb)
        # Input snapshots: the forwards counted per compilation hash, and the rules of the agent's hello.
        self._calls, self._snap_pre = CallCounter(), None
        self._pending = PendingDumps(lambda: self._mb, due_dumps_asker(self._sock, self._avail, self._bound_s, self._hello, self.stats, self._stall),
                                     self._stall)
        if self.async_scheduling and self._mb.features & mb.FEATURE_SNAPSHOTS:
            # Refused at startup: the agent says input snapshots are on, and they need sync scheduling.
            raise ConfigError("input snapshots need sync scheduling: under async scheduling the input buffers may still "
                              "belong to an in-flight prior forward. Disable async scheduling (--no-async-scheduling / "
                              "async_scheduling=False) or unset WAVEBUS_SNAPSHOT_ENABLE "
                              "(and VLLM_NEURON_RUNTIME_INPUT_SNAPSHOT_ENABLE)")

    @property
    def features(self) -> int:
        """The mailbox's feature bits, read now: a memory load, no system call, nothing sent.
        Read live (not once) so that an agent still settling at connect() cannot leave the client
        off for good; with every bit 0 each call returns at once."""
        return self._mb.features

    @property
    def enabled(self) -> bool:
        return self._mb.features != 0

    # ------------------------------------------------------------------ construction

    @classmethod
    def connect(cls, endpoint: Optional[str] = None, mailbox: Optional[str] = None, *, env=None, **kw) -> "Client":
        """Attach to this rank's agent: ``ipc://$WAVEBUS_RUN_DIR/agent-local$LOCAL_RANK.sock`` and
        ``$WAVEBUS_RUN_DIR/mailbox-local$LOCAL_RANK`` unless given. Sends nothing."""
        if endpoint is None or mailbox is None:
            e, m = env_paths(os.environ if env is None else env)
            endpoint = e if endpoint is None else endpoint
            mailbox = m if mailbox is None else mailbox
        return cls(endpoint, mailbox, **kw)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ agent availability

    @property
    def agent_unavailable(self) -> bool:
        """True while the agent is known not to answer: calls skip it until it answers again."""
        return self._avail.unavailable

    @property
    def last_error(self) -> str:
        """The last error a per-step call met and swallowed (the step went on)."""
        return self._avail.last_error

    @last_error.setter
    def last_error(self, value: str) -> None:
        self._avail.last_error = value

    def _agent_back(self) -> None:
        self.agent_features = None  # it may be a new agent: introduce ourselves again
        self._sock.forget("hello")
        self._sent_regions.clear()

    def _ping(self) -> None:
        """A ping whose answer nobody waits for: it only shows the agent alive (Availability.heard)."""
        self._sock.send(pb.ClientRequest(ping=pb.Ping()), later=("ping", None))

    # ------------------------------------------------------------------ hello

    def _apply_hello(self, reply: "pb.ClientReply") -> None:
        # A version mismatch is refused at once, by either side, naming both versions.
        if not reply.ok and reply.error_code == "ERR_PROTOCOL_VERSION":
            raise ProtocolError(f"the wavebus agent at {self.endpoint} refused the client: {reply.error}", "ERR_PROTOCOL_VERSION")
        mismatch = protocol_mismatch("client", reply.protocol_version, f"hello to the agent at {self.endpoint}")
        if mismatch is not None:
            raise mismatch
        if not reply.ok:
            raise AgentError(f"the wavebus agent refused hello: {reply.error}", reply.error_code or "ERR_AGENT")
        self.agent_features = Features.from_reply(reply)
        self._snap_pre = SnapshotPrecheck.from_reply(reply)
        self._recorder_path = reply.recorder_path
        self._forget_decision_ring(reply.decision_path)
        if reply.recorder_path and reply.fault_path:
            # The recorder is on: a fatal signal's traceback goes where the agent reads it after a death.
            self.fault_file = enable_fault_file(reply.fault_path, os.path.dirname(self.mailbox_path))
        if self._rec is not None:  # a new hello may be a new agent with a new ring: mapped again when used
            self._rec.close()
            self._rec = None
        # Every hello that asks makes a fresh ring file (the same path, a new file): mapped again when used.
        if self._ring is not None:
            self._ring.close()
        self._ring, self._ring_path = None, reply.ring_path
        if reply.mailbox_path and os.path.realpath(reply.mailbox_path) != os.path.realpath(self.mailbox_path):
            self._mb.close()
            self._mb = mb.Mailbox(reply.mailbox_path)
            self.mailbox_path = reply.mailbox_path

    def _hello(self, deadline: float) -> bool:
        """Say hello once (lazily); False if the answer did not come by the deadline."""
        if self.agent_features is not None:
            return True
        hello_id = self._sock.in_flight("hello")  # a late answer to an earlier hello is still applied
        if not hello_id:
            req = pb.ClientRequest(hello=pb.ClientHello(pid=os.getpid(), async_scheduling=self.async_scheduling, language="python",
                                                        protocol_version=CLIENT_PROTOCOL_VERSION, fingerprint=self._own_fingerprint(),
                                                        pid_namespace=pid_namespace(), **self._ring_request))
            if not self._sock.send(req, later=("hello", self._apply_hello)):
                return False
            hello_id = req.id
        reply = self._sock.wait(hello_id, deadline)
        if reply is not None:
            self._apply_hello(reply)
        return self.agent_features is not None

    def _own_fingerprint(self) -> "pb.Fingerprint":
        if self._fingerprint is None:
            self._fingerprint = client_fingerprint(self.engine_version)
        return self._fingerprint

    def hello(self) -> Optional[Features]:
        """Say hello now (normally lazy). None when everything is off (nothing is sent)."""
        if not self.enabled:
            return None
        self._ensure_hello("hello()")
        return self.agent_features

    def _rejoin(self) -> None:
        """Forget what the agent knew of us (after an agent restart); the next call says hello again."""
        self.agent_features = None
        self._sock.forget("hello")
        self._sent_regions.clear()
        self.stats["rejoins"] = self.stats.get("rejoins", 0) + 1

    def _ensure_hello(self, where: str) -> None:
        if self._avail.still_unavailable():
            raise AgentUnavailableError(f"{where}: the wavebus agent at {self.endpoint} is not answering ({self.last_error})")
        if not self._hello(time.monotonic() + self.hello_timeout_ms / 1000):
            why = f"{where}: the wavebus agent at {self.endpoint} did not answer hello within {self.hello_timeout_ms} ms"
            self._avail.mark_unavailable(why)
            raise AgentUnavailableError(why)

    # ------------------------------------------------------------------ per step

    def call_bound_ms(self) -> float:
        """The bound of a per-step call: call_timeout_ms, else the agent's end-of-wave bound."""
        if self.call_timeout_ms is not None:
            return self.call_timeout_ms
        return self.agent_features.end_of_wave_timeout_ms if self.agent_features else DEFAULT_END_OF_WAVE_TIMEOUT_MS

    def _bound_s(self) -> float:
        return (self.call_bound_ms() + self.end_of_wave_margin_ms) / 1000

    def wave_head(self, wave: int, telemetry=None) -> bool:
        """Mark the head of ``wave`` (with the telemetry of the previous wave). Only TP0 of the last
        PP stage sends, only while the bus is active; never waits for the answer. True if sent.
        The dict / dataclass form; ``tensor_batch()`` is the per-step path whose cost does not grow
        with the batch."""
        feats = self._head_gate(wave, self._head)
        if feats is None:
            return False
        body = self._head.build(wave, telemetry, bool(feats & mb.FEATURE_DETECTORS), self._mb.epoch)
        if not self._send_head(body):
            self._head.resend()  # its bindings may have been in this one
            return False
        return True

    def _head_ready(self, wave, feats: int) -> bool:
        """_head_gate's usual outcome, in loads only: a valid wave, sending on, the agent answering
        and known, this rank its replica's TP0, every region sent, no answer awaited (drain would
        read nothing). Sets the head's wave as _head_gate does; False hands the call to _head_gate."""
        af = self.agent_features
        if (type(wave) is int and 0 <= wave <= _MAX_U64 and feats & _SENDS and af is not None and af.tp0
                and not self._avail.unavailable and len(self._sent_regions) == len(self._regions) and not self._sock.awaiting):
            self._head_wave = wave
            return True
        return False

    def _head_gate(self, wave: int, builder):
        """The checks every wave head passes: the features when this rank sends now, else None
        (``builder.reset()`` when sending paused)."""
        check_wave(wave, "wave_head()")
        self._head_wave = wave
        feats = self._mb.features
        if not feats & (mb.FEATURE_BUS | mb.FEATURE_HEADS):  # also covers "everything off"
            builder.reset()  # requests freed meanwhile go unseen: start over when sending again
            return None
        if self._avail.still_unavailable():
            # Nothing queues up for an agent that is gone; the bindings go again once it is back.
            builder.reset()
            self.stats["wave_head_skipped"] += 1
            return None
        if self.agent_features is None and not self._hello(time.monotonic() + self._bound_s()):
            self._avail.mark_unavailable(f"wave_head({wave}): no answer to hello within {self.call_bound_ms()} ms")
            self.stats["wave_head_skipped"] += 1
            return None
        if not self.agent_features.tp0:
            builder.reset()
            return None
        if len(self._sent_regions) != len(self._regions) and not self._flush_regions(time.monotonic() + self._bound_s(), step=True):
            self.stats["wave_head_skipped"] += 1
            return None
        self._sock.drain()
        return feats

    def _send_head(self, body: "pb.WaveHeadRequest") -> bool:
        # One-way: the engine never waits for the agent or the coordinator at the head of a wave.
        if not self._sock.send(pb.ClientRequest(wave_head=body), one_way=True):
            self.stats["wave_head_skipped"] += 1
            return False
        self.stats["wave_head_sent"] += 1
        return True

    def end_of_wave(self, wave: int) -> EndOfWaveResult:
        """End ``wave``. Returns at once when its vector is in the mailbox with nothing due; else asks
        the agent to do what is due, waiting at most the bound (then timed_out=True)."""
        if type(wave) is not int or not 0 <= wave <= _MAX_U64:
            check_wave(wave, "end_of_wave()")
        self._ended_wave = wave
        pending = self._pending
        pending.last_ended = wave
        if pending._due:  # the usual step asked nothing: nothing to drop
            pending.ended(wave)
        box = self._mb
        q = box._q  # the features word, read in place (None once closed: off)
        if q is None or not q[_Q_FEATURES] & _BUS:  # also covers "everything off"
            return EndOfWaveResult(wave)
        v = box.read_wave(wave)
        if v is not None and not (v.config_due or v.dump_due or v.snapshot_due):
            self.stats["end_of_wave_fast"] += 1
            return EndOfWaveResult(wave, False, False, 0, v)
        # Vectors stalled (one bound was spent on it), or a wave pending_dump gave up: no wait, no copy.
        if (v.dump_due and wave <= self._pending.forfeited_to) if v is not None else self._stall.active():
            self.stats["end_of_wave_timeouts"] += 1
            self.stats["stalled_skips"] += 1
            self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, missed=True)), one_way=True)
            return EndOfWaveResult(wave, timed_out=True, vector=v)
        if self._avail.still_unavailable():
            # Its mailbox is not updated any more: no waiting, the step goes on (counted). A frozen
            # agent still learns of the miss when it resumes (one-way; dropped if its queue is full).
            self.stats["end_of_wave_timeouts"] += 1
            self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, missed=True)), one_way=True)
            return EndOfWaveResult(wave, timed_out=True, vector=v)
        if v is None and self.agent_features is not None and self._mb.can_wait and len(self._sent_regions) == len(self._regions):
            # Late vector, agent known: sleep on the mailbox (the agent's publish wakes us), no request.
            # A late vector may mean a dead agent (nobody updates the mailbox): ask it alongside.
            since = time.monotonic()
            if not self._sock.in_flight("ping"):
                self._ping()
            got = self._mb.wait_wave(wave, self.call_bound_ms() / 1000)
            if got == "timeout":
                self.stats["end_of_wave_timeouts"] += 1
                self.stats["end_of_wave_waited"] += 1
                self._stall.begin()
                self._sock.drain()
                if self._avail.last_answer < since:
                    self._sock.forget("ping")
                    self._avail.mark_unavailable(f"end_of_wave({wave}): no answer within {self.call_bound_ms()} ms")
                # One-way: the agent counts the miss and fails the wave's dumps if they arrive later.
                self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, missed=True)), one_way=True)
                return EndOfWaveResult(wave, timed_out=True)
            if isinstance(got, mb.WaveVector):
                self.stats["end_of_wave_waited"] += 1
                # Late but within the bound: the agent counts it (one-way; /metrics per rank).
                self.stats["late_vectors"] += 1
                self._sock.send(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave, late=True)), one_way=True)
                v = got
                if not v.anything_due:
                    return EndOfWaveResult(wave, vector=v)
        deadline = time.monotonic() + self._bound_s()
        res = EndOfWaveResult(wave, sent=True, vector=v)
        self.stats["end_of_wave_sent"] += 1
        reply = None
        if self._hello(deadline) and (len(self._sent_regions) == len(self._regions) or self._flush_regions(deadline, step=True)):
            reply = self._sock.request(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave)), deadline)
            if reply is not None and not reply.ok and reply.error_code == "ERR_NO_HELLO":
                # The agent restarted and does not know us: hello and regions again, retry within the bound.
                self._rejoin()
                if self._hello(deadline) and self._flush_regions(deadline, step=True):
                    reply = self._sock.request(pb.ClientRequest(end_of_wave=pb.EndOfWave(wave=wave)), deadline)
        if reply is None:
            self._avail.mark_unavailable(f"end_of_wave({wave}): no answer within {self.call_bound_ms()} ms")
        elif reply.coordinator_lost:
            self.stats["coordinator_lost"] += 1
        if reply is not None and reply.timed_out:
            self._stall.begin()  # the agent waited the bound for the vector (or knows none is coming)
        if reply is None or reply.timed_out:
            res.timed_out = True
            self.stats["end_of_wave_timeouts"] += 1
        if reply is not None:
            res.dumps_written = reply.dumps_written
            if not reply.ok:
                res.error = f"{reply.error_code} {reply.error}".strip()
                self.stats["end_of_wave_errors"] += 1
                self.last_error = f"end_of_wave: {res.error}"
                log.warning("wavebus end_of_wave(%d): %s", wave, res.error)
        if res.vector is None:
            res.vector = self._mb.read_wave(wave)
        return res

    def pending_dump(self, req_id: str) -> bool:
        """True when a dump of ``req_id`` is armed for a wave whose end_of_wave has not run on this rank
        yet: keep the request's blocks one more step before freeing them. A few memory loads (no
        system call) when no vector in the mailbox has dump_due; else the due wave's req ids are asked
        of the agent once per wave (within the call bound; no answer counts as pending)."""
        box = self._mb
        q = box._q  # the features word, read in place (None once closed: off)
        if q is None or not q[_Q_FEATURES] & _BUS:
            return False
        return self._pending.check(req_id, box)

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Say goodbye (if ever said hello) and release the socket and the mailbox mapping."""
        if self._closed:
            return
        self._closed = True
        if self._sock.opened:
            try:
                if self.agent_features is not None:
                    self._sock.request(pb.ClientRequest(close=pb.Close()), time.monotonic() + 0.2)
            finally:
                self._sock.close()
        if self._rec is not None:
            self._rec.close()
        self._forget_decision_ring("")
        if self._ring is not None:
            self._ring.close()
        disable_fault_file()
        self._mb.close()
