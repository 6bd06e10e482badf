"""A small Llama with random weights, saved with save_pretrained (no hub): the model serve.py loads.

    python make_model.py DIR [DIR:SEED[:SCALE] ...] [--layers 2] [--seed 0]

Several directories in one run (one import of transformers): DIR:SEED gives that one its own seed;
SCALE multiplies its LM head, which makes the model confident (greedy log-probs near 0), so that a
garbled head (serve.py --garble) stands out to the garbled detector; random weights alone are near
uniform over the vocabulary, which that detector rightly calls gibberish.
"""
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dirs", nargs="+", metavar="DIR[:SEED]")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    # 4 query heads and 2 KV heads: TP=2 gives each rank one KV head (the cache is sharded by head).
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    for spec in args.dirs:
        path, seed, scale = (spec.split(":") + ["", ""])[:3]
        torch.manual_seed(int(seed) if seed else args.seed)
        model = LlamaForCausalLM(cfg)
        if scale:
            with torch.no_grad():
                model.lm_head.weight.mul_(float(scale))
        model.save_pretrained(path)


if __name__ == "__main__":
    main()
