"""The client's socket to its agent: one DEALER, sends that never block, and the one map of
requests whose answers nobody waits for right now (a ping, a hello still in flight)."""
import time
from typing import Callable, Dict, Optional

from . import wavebus_pb2 as pb


class AgentSocket:
    """Requests carry increasing ids; ``wait(rid)`` reads answers until ``rid``'s, handing the
    others to the handler they were sent with (or counting them stale)."""

    def __init__(self, endpoint: str, stats: Dict[str, int], heard: Callable[[], None]):
        self.endpoint = endpoint
        self._stats = stats
        self._heard = heard
        self._ctx = None
        self._sock = None
        self._zmq = None
        self._next_id = 0
        # id -> (kind, handler): answers applied when they arrive while another request is awaited.
        self._later: Dict[int, tuple] = {}

    @property
    def opened(self) -> bool:
        return self._sock is not None

    def _socket(self):
        if self._sock is None:
            import zmq

            self._zmq = zmq
            self._ctx = zmq.Context()
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            # The agent's replies are small; a larger message is dropped by libzmq, never buffered.
            s.setsockopt(zmq.MAXMSGSIZE, pb.CLIENT_SOCKET_MAX_MESSAGE_BYTES)
            s.connect(self.endpoint)
            self._sock = s
        return self._sock

    def send(self, req: "pb.ClientRequest", one_way: bool = False, later: Optional[tuple] = None) -> bool:
        """Queue ``req`` without blocking. ``one_way``: id 0, the agent answers nothing. ``later``:
        (kind, handler) for an answer that arrives while nobody waits for it."""
        if one_way:
            req.id = 0
        else:
            self._next_id += 1
            req.id = self._next_id
        try:
            self._socket().send(req.SerializeToString(), self._zmq.NOBLOCK)
        except self._zmq.Again:
            return False  # the queue to the agent is full: treat like no answer
        self._stats["requests_sent"] += 1
        if later is not None and not one_way:
            self._later[req.id] = later
        return True

    @property
    def awaiting(self) -> bool:
        """Whether an answer is still listed (drain would read the socket)."""
        return bool(self._later)

    def in_flight(self, kind: str) -> int:
        """The id of a request of ``kind`` whose answer has not come yet, else 0."""
        for rid, (k, _) in self._later.items():
            if k == kind:
                return rid
        return 0

    def forget(self, kind: str) -> None:
        """Its answers, if they still come, are stale."""
        for rid in [rid for rid, (k, _) in self._later.items() if k == kind]:
            del self._later[rid]

    def wait(self, rid: int, deadline: float) -> Optional["pb.ClientReply"]:
        """The answer to request ``rid``, or None at the deadline (monotonic seconds)."""
        zmq = self._zmq
        sock = self._sock
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not sock.poll(left_ms, zmq.POLLIN):
                return None
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                reply = pb.ClientReply()
                try:
                    reply.ParseFromString(frames[-1])
                except Exception:  # garbage from the socket must not crash the engine
                    self._stats["bad_replies"] += 1
                    continue
                self._heard()
                later = self._later.pop(reply.id, None)
                if reply.id == rid:
                    return reply
                if later is None:
                    self._stats["stale_replies"] += 1
                elif later[1] is not None:
                    later[1](reply)

    def drain(self) -> None:
        """Read whatever came, without waiting. Only answers come, and only to requests still
        listed: with none, nothing can have come and no system call is made (zmq_poll would)."""
        if self._sock is not None and self._later:
            self.wait(-1, time.monotonic())

    def request(self, req: "pb.ClientRequest", deadline: float) -> Optional["pb.ClientReply"]:
        if not self.send(req):
            return None
        return self.wait(req.id, deadline)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._ctx.term()
            self._sock = None
