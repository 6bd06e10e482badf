"""The probe (wavebus_client.probe) on a transformers model: each module's TP split from the model's
own ``tp_plan`` (docs/bisect.md, docs/transformers.md).

transformers shards by module name, not type: every projection is an ``nn.Linear`` and
``tp_plan`` maps ``layers.*.self_attn.q_proj`` to a style (``colwise``, ``rowwise``,
``colwise_gather_output`` ...) whose ``input_layouts`` / ``output_layouts`` say how the tensors a
hook sees are split: ``Shard(d)`` (this rank holds a slice along d) or ``Replicate()`` (a rowwise
linear all-reduces inside, a gathered LM head gathers). A module without a plan entry is
replicated (norms, the embedding, decoder layers, ``self_attn`` and ``mlp``, whose outputs come
after an all-reduce). Elementwise activations (``act_fn``) keep their input's split, which the
plan does not state: ``INCLUDE`` leaves them out.

    from wavebus_client.integrations.transformers_probe import INCLUDE, tp_splits
    probe = Probe(model, global_rank=g, tp_rank=t, tp_size=n, split_for=tp_splits(model), include=INCLUDE)
"""
from typing import Callable, Optional

from ..probe import REPLICATED, Split

# Every module but the elementwise activations (their split is their input's; see above).
INCLUDE = (r"re:^(?!.*\.act_fn$)",)


def _split(placement) -> Optional[Split]:
    kind = type(placement).__name__
    if kind == "Replicate":
        return REPLICATED
    if kind == "Shard":
        return Split("column", int(placement.dim))
    return None  # Partial or a style of its own: the probe's default


def tp_splits(model) -> Callable[[str, object, str], Optional[Split]]:
    """``split_for`` for ``Probe``: the split of module ``name``'s output (io "output") or positional
    inputs (io "input") under the model's tp_plan; None where the plan says nothing."""
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, _get_parameter_tp_plan

    plan = dict(getattr(model, "tp_plan", None) or {})

    def split_for(name: str, _module, io: str) -> Optional[Split]:
        style = _get_parameter_tp_plan(parameter_name=name, tp_plan=plan, is_weight=False)
        if style is None or style not in ALL_PARALLEL_STYLES:
            return None
        return _split(getattr(ALL_PARALLEL_STYLES[style], "output_layouts" if io == "output" else "input_layouts", None))

    return split_for


__all__ = ["INCLUDE", "tp_splits"]
