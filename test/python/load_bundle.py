"""Load call dirs with wavebus_client.replay and print what came back, as one JSON list.

Usage: load_bundle.py CALL_DIR...   (a dir written as verify:DIR is loaded with verify=True)
Each entry: {"ok": true, "tensors": [[dtype, shape, bits-as-hex], ...], "warnings": [...]} or
{"ok": false, "error": "...", "type": "ReplayError"}.
"""
import json
import sys
import warnings

import torch

from wavebus_client.replay import load_call_dir


def bits(t):
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy().tobytes().hex()


def load(call_dir, verify):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _meta, ts = load_call_dir(call_dir, verify=verify)
        except Exception as e:  # the test asserts on the type and message
            return {"ok": False, "error": str(e), "type": type(e).__name__}
    out = [[str(t.dtype).replace("torch.", ""), list(t.shape), bits(t)] for t in ts]
    return {"ok": True, "tensors": out, "warnings": [str(w.message) for w in caught]}


def main():
    out = []
    for a in sys.argv[1:]:
        out.append(load(a[len("verify:"):], True) if a.startswith("verify:") else load(a, False))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
