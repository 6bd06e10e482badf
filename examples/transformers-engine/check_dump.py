"""Check one KV dump of serve.py against the engine's own pages (wavebus demo --engine transformers).

    python check_dump.py WAVE_DIR OUT

WAVE_DIR is a dump's wave directory (.../kv_cache/<req>/wave_<W>); OUT is serve.py's --out, where
--save-copies kept, at every wave whose end_of_wave copied a dump, each request's pages as
transformers' own page views read them (copy_rank<r>_wave<W>.pt). Every dumped layer's K and V of
every rank directory must equal them bit for bit. Exits 1 naming the first difference.
"""
import os
import re
import sys

import torch


def main() -> int:
    wave_dir, out = sys.argv[1], sys.argv[2]
    wave = int(os.path.basename(wave_dir).split("_")[1])
    req = os.path.basename(os.path.dirname(wave_dir))
    n = 0
    for rd in sorted(d for d in os.listdir(wave_dir) if re.fullmatch(r"dp0_tp[0-9]+_pp0_cp0", d)):
        rank = int(rd.split("_")[1][2:])
        copy_file = os.path.join(out, f"copy_rank{rank}_wave{wave}.pt")
        if not os.path.exists(copy_file):
            print(f"{rd}: no engine copy {copy_file}")
            return 1
        copy = torch.load(copy_file).get(req)
        if copy is None:
            print(f"{rd}: the engine held no pages of {req} at wave {wave}")
            return 1
        for f in sorted(x for x in os.listdir(os.path.join(wave_dir, rd)) if x.endswith(".pt")):
            dump = torch.load(os.path.join(wave_dir, rd, f), weights_only=True)
            want = copy["layers"].get(f[:-3])
            if want is None or list(dump["block_ids"]) != copy["block_ids"]:
                print(f"{rd}/{f}: blocks {list(dump['block_ids'])}, the engine's {copy['block_ids']}")
                return 1
            for kv in ("k", "v"):
                if dump[kv].shape != want[kv].shape or not torch.equal(dump[kv].view(torch.int32), want[kv].view(torch.int32)):
                    print(f"{rd}/{f}: {kv} differs from the engine's pages")
                    return 1
                n += 1
    if n == 0:
        print("no dumped K/V tensor found")
        return 1
    print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
