"""The client's pre-check of the input-snapshot rules (docs/snapshots.md, "Which forwards talk to
the agent"): with snapshots on, a forward no rule could select costs no message.

The agent's hello names the rules in force on its rank (Features.snapshot_selection; fixed at its
start-up). The client counts every post-warmup forward of each compilation hash itself, as the
agent's selector would, and offers a forward only when a rule could fire, with the call index it
counted (BeforeForward.call_index_plus1), so the agent's count stays right although it sees fewer
forwards. The agent still decides on what it is offered (and keeps its budget): this check may
only say "could fire" too often, never too rarely. With the default rule (call 0 only) a forward
costs a dict lookup; the token and request rules look at the batch only when configured.
"""
from typing import Dict, Optional

from . import wavebus_pb2 as pb

_SEL = pb.SnapshotSelection


def _getter(context):
    return context.get if isinstance(context, dict) else lambda k, d=None: getattr(context, k, d)


class CallCounter:
    """Post-warmup forwards per compilation hash, counted by the client while snapshots are on (kept
    across hellos: a restarted agent learns the index from the next forward offered)."""

    def __init__(self):
        self._calls: Dict[str, int] = {}

    def count(self, context) -> Optional[int]:
        """This forward's call index (counted), None for a warmup forward (neither counted nor captured)."""
        get = _getter(context)
        if get("warmup", False) is True:
            return None
        h = get("compilation_hash")
        if not isinstance(h, str):
            return -1  # a bad context: offered, so that before_forward's checks name the field
        i = self._calls.get(h, 0)
        self._calls[h] = i + 1
        return i


class SnapshotPrecheck:
    """The rules of one agent's hello."""

    def __init__(self, sel: "pb.SnapshotSelection"):
        self.rank_selected = sel.rank_selected
        self.call_rule = sel.call_rule
        self.call_indices = frozenset(sel.call_indices)
        self.token_targets = frozenset(sel.token_targets)
        self.request_ids = tuple(sel.request_ids)

    @classmethod
    def from_reply(cls, reply: "pb.ClientReply") -> Optional["SnapshotPrecheck"]:
        """None when the agent did not say (snapshots off, or an older agent): every forward is offered."""
        f = reply.features
        return cls(f.snapshot_selection) if f.HasField("snapshot_selection") else None

    def could_fire(self, context, call_index: Optional[int]) -> bool:
        """Whether a rule could select this forward (a warmup one: never; a bad context: yes)."""
        if call_index is None:
            return False
        if call_index < 0:
            return True
        if not self.rank_selected:
            return False
        rule = self.call_rule
        if rule == _SEL.ALL or (rule == _SEL.FIRST and call_index == 0) or (rule == _SEL.INDICES and call_index in self.call_indices):
            return True
        get = _getter(context)
        if self.request_ids and self._request_could_match(get("req_ids", ())):
            return True
        return bool(self.token_targets) and not get("is_prompt", False) and self._token_could_match(get("positions", ()), get("num_speculative_tokens", 0))

    def _request_could_match(self, req_ids) -> bool:
        # The agent's rule: the id, or its prefix before a "-" (vLLM's "<id>-<suffix>").
        targets = self.request_ids
        for rid in req_ids:
            if not isinstance(rid, str):
                return True  # bad input: let the agent's checks name it
            for t in targets:
                if rid == t or rid.startswith(t + "-"):
                    return True
        return False

    def _token_could_match(self, positions, nst) -> bool:
        # A decode row at position p makes tokens p+1 .. p+nst+1: any hit could fire (rows of no
        # request are not excluded here: "too often" is allowed).
        try:
            import numpy as np

            p = np.asarray(positions.cpu() if hasattr(positions, "cpu") else positions, dtype=np.int64).reshape(-1)
            k = int(nst) + 1
        except (TypeError, ValueError, OverflowError):
            return True
        if k < 1:
            return True  # bad input: let the agent's checks name it
        t = np.fromiter(self.token_targets, dtype=np.int64, count=len(self.token_targets))
        p = p[p >= 0]
        hits = np.isin((p[:, None] + np.arange(1, k + 1, dtype=np.int64)[None, :]).reshape(-1), t)
        return bool(hits.any())
