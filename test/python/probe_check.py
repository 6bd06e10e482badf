"""wavebus_client.probe on its own, for test/bisect.test.ts: off means no hooks; the name and layer
filters; the copy is taken when the hook runs; the bundle (atomic, replaced whole on a rerun, every
dtype through .npy as numpy and load_call_dir read it); and two bf16 trees OUT/bf16_a, OUT/bf16_b
whose outputs differ by one bf16 step (within bf16's tolerance, not fp32's). Prints "ok"."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from wavebus_client.errors import ConfigError  # noqa: E402
from wavebus_client.probe import COLUMN, Probe, Split, parse_layers  # noqa: E402
from wavebus_client.replay import load_call_dir  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        out = y.clone()
        y.mul_(0)  # a later in-place change: the probe's copy must not see it
        return out


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


def hooks(net):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in net.modules())


def main(out):
    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 4)
    p = Probe(net, include=["layers.*.proj", "head"], layers=parse_layers("1-2"))
    assert hooks(net) == 0, "a probe that is not attached installs nothing"
    with p:
        assert hooks(net) == 3, hooks(net)  # layers.1.proj, layers.2.proj, head
        net(x)
    assert hooks(net) == 0, "detach removes every hook"
    assert [r["module"] for r in p.records] == ["layers.1.proj", "layers.2.proj", "head"], p.records
    assert not torch.equal(p.tensors[0], torch.zeros(3, 4)), "the copy was taken before the in-place change"
    assert all(r["split"] == "replicated" for r in p.records)  # torch.nn.Linear's default
    d = p.write(out, 7)
    assert d == os.path.join(out, "rank0", "call7")
    meta, ts = load_call_dir(d)
    assert meta["probe"]["records"][2]["module"] == "head" and torch.equal(ts[2], p.tensors[2])
    p.begin()
    with p:
        net(x * 2)
    p.write(out, 7)  # a rerun replaces the bundle whole
    assert sorted(os.listdir(os.path.join(out, "rank0"))) == ["call7"], os.listdir(os.path.join(out, "rank0"))
    assert torch.equal(load_call_dir(d)[1][2], p.tensors[2])
    assert oct(os.stat(d).st_mode & 0o777) == "0o700" and oct(os.stat(os.path.join(d, "meta.json")).st_mode & 0o777) == "0o600"

    # Every dtype numpy can hold round-trips through .npy as numpy reads it (bf16 as raw |V2 bits).
    class Cast(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.bfloat16), x.to(torch.float16), (x * 10).to(torch.int32), x > 0

    sub = torch.nn.Sequential(Cast())
    pr = Probe(sub, include=["0"])
    with pr:
        sub(torch.randn(2, 3))
    dc = pr.write(os.path.join(out, "dtypes"), 0)
    for i, want in enumerate(pr.tensors):
        arr = np.load(os.path.join(dc, f"tensor{i}.npy"))
        got = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16) if want.dtype == torch.bfloat16 else torch.from_numpy(arr)
        assert got.dtype == want.dtype and torch.equal(got, want), (i, got, want)
    assert [str(t.dtype) for t in load_call_dir(dc)[1]] == ["torch.bfloat16", "torch.float16", "torch.int32", "torch.bool"]

    for bad in (lambda: parse_layers("3-1"), lambda: Probe(net, include=["re:("]), lambda: Probe(net, tp_rank=2, tp_size=2)):
        try:
            bad()
            raise AssertionError("accepted")
        except ConfigError:
            pass

    # A split that does not fit the tensor: the forward still runs, the write refuses, nothing is left.
    pbad = Probe(net, include=["head"], splits={torch.nn.Linear: Split("column", 5)})
    with pbad:
        assert net(x).shape == (3, 2)
    try:
        pbad.write(os.path.join(out, "refused"), 0)
        raise AssertionError("accepted")
    except ConfigError as e:
        assert "head output 0" in str(e), e
    assert not os.path.exists(os.path.join(out, "refused", "rank0", "call0"))

    # Two bf16 trees one bf16 step apart (2^-7 relative at 1.0), column split over 2 ranks.
    class Proj(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.w = w

        def forward(self, x):
            return (x @ self.w.t()).to(torch.bfloat16)

    w = torch.ones(4, 4)
    for name, bump in (("bf16_a", 2 ** -7), ("bf16_b", 0.0)):
        for rank in range(2):
            m = Proj(w[rank * 2:(rank + 1) * 2] * (1 + (bump if rank == 1 else 0)))
            root = torch.nn.Sequential(m)
            pb = Probe(root, global_rank=rank, tp_rank=rank, tp_size=2, splits={Proj: COLUMN})
            with pb:
                root(torch.full((2, 4), 0.25))
            pb.write(os.path.join(out, name), 0)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
