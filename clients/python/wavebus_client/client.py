"""The engine-side client of a rank's wavebus agent.

Thin by design: with everything off it sends nothing and does nothing per step. The per-step
check (end_of_wave) reads the agent's shared-memory mailbox; the agent is asked only when this
rank has work in that wave, and never waited on beyond the configured bound.

Not thread-safe: call it from the engine's step thread only.
"""
import os
import random
import time
from typing import Dict, Optional

from . import mailbox as mb
from . import wavebus_pb2 as pb
from .fault_file import disable_fault_file, enable_fault_file, pid_namespace
from .fingerprint import client_fingerprint
from .availability import Availability
from .digest import DigestMixin
from .errors import AgentError, AgentUnavailableError, ConfigError, ProtocolError
from .snapshot_select import CallCounter, SnapshotPrecheck
from .features import Features
from .live_capture import CaptureMixin
from .protocol import CLIENT_PROTOCOL_VERSION, protocol_mismatch
from .region import Region
from .registration import RegionsMixin
from .transport import AgentSocket
from .paths import env_paths
from .pending import PendingDumps, VectorStall, due_dumps_asker
from .step_calls import EndOfWaveResult, StepCallsMixin
from .tensor_head import TensorHeadMixin
from .wave_head import WaveHeadBuilder

__all__ = ["Client", "EndOfWaveResult", "Features"]  # EndOfWaveResult lives in step_calls.py


class Client(StepCallsMixin, RegionsMixin, CaptureMixin, DigestMixin, TensorHeadMixin):
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
        from . import native

        native.load()  # a bad WAVEBUS_PY_NATIVE is an error here, at setup, not a ring left unused later
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
