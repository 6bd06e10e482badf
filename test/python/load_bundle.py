"""Load a call dir with wavebus_client.replay and print what came back, as JSON.

Usage: load_bundle.py CALL_DIR [verify]
Prints {"ok": true, "tensors": [[dtype, shape, bits-as-hex], ...], "warnings": [...]} or
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


def main():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _meta, ts = load_call_dir(sys.argv[1], verify=len(sys.argv) > 2 and sys.argv[2] == "verify")
        except Exception as e:  # the test asserts on the type and message
            print(json.dumps({"ok": False, "error": str(e), "type": type(e).__name__}))
            return
    out = [[str(t.dtype).replace("torch.", ""), list(t.shape), bits(t)] for t in ts]
    print(json.dumps({"ok": True, "tensors": out, "warnings": [str(w.message) for w in caught]}))


if __name__ == "__main__":
    main()
