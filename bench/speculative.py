"""Speculative decoding against plain decoding, greedy, in one process, runs alternating.

    python bench/speculative.py MODEL --prompt-lookup [--rounds 3] [-n 200] [--threads 2]
    python bench/speculative.py MODEL --draft DRAFT [--num-draft 5] [--task code]

Each round runs the same chat prompt plainly and speculatively (which first alternates) and
checks the two outputs are the same tokens. Printed: per run the decode tokens/s of both, the
acceptance rate (kept / drafted tokens) and tokens per target pass; then the medians and the
speed-up (median of the per-round ratios). Tasks: ``edit`` (rename a variable in a 40-line
function and return it whole: the answer repeats its input, where prompt lookup pays off) and
``code`` (write a function from a description: new text, for a draft model).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import clearlm

CODE = '''def summarize(orders, tax_rate=0.2):
    total = 0
    count = 0
    largest = None
    for order in orders:
        if order.get("cancelled"):
            continue
        amount = order["price"] * order["quantity"]
        if order.get("discount"):
            amount = amount * (1 - order["discount"])
        total = total + amount
        count = count + 1
        if largest is None or amount > largest:
            largest = amount
    if count == 0:
        return {"total": 0, "count": 0, "average": 0, "largest": None, "tax": 0}
    average = total / count
    tax = total * tax_rate
    return {
        "total": round(total, 2),
        "count": count,
        "average": round(average, 2),
        "largest": round(largest, 2),
        "tax": round(tax, 2),
    }


def by_customer(orders):
    groups = {}
    for order in orders:
        customer = order["customer"]
        if customer not in groups:
            groups[customer] = []
        groups[customer].append(order)
    return {customer: summarize(items) for customer, items in groups.items()}
'''

TASKS = {
    "edit": "Rename the variable `total` to `subtotal` everywhere in this Python code and "
    "return the whole code, nothing else:\n\n```python\n" + CODE + "```",
    "code": "Write a Python function that parses a CSV file of orders (customer, price, "
    "quantity, discount) and returns the total per customer, with a docstring and type hints.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the target: a GGUF path or alias")
    ap.add_argument("--draft", help="a draft model (same tokenizer)")
    ap.add_argument("--prompt-lookup", action="store_true", help="draft by n-gram lookup")
    ap.add_argument("--num-draft", type=int, default=None, help="tokens drafted per step")
    ap.add_argument("--task", choices=sorted(TASKS), default="edit")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if bool(args.draft) == args.prompt_lookup:
        sys.exit("give --draft DRAFT or --prompt-lookup")
    model = clearlm.load(args.model, threads=args.threads)
    draft = clearlm.load(args.draft, threads=args.threads) if args.draft else None
    spec = dict(draft=draft, prompt_lookup=args.prompt_lookup, num_draft=args.num_draft)
    prompt, n = TASKS[args.task], args.max_new_tokens
    plain_tps, spec_tps, ratios = [], [], []
    print(f"{args.model}, {'draft ' + args.draft if draft else 'prompt lookup'}, task "
          f"{args.task}, {n} new tokens, greedy")
    print("round | plain tok/s | speculative tok/s | accepted | tokens/pass | same tokens")
    for r in range(args.rounds):
        runs = {}
        for kind in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
            extra = spec if kind == "spec" else {}
            runs[kind] = model.chat(prompt, max_new_tokens=n, temperature=0, **extra)
        a, b = runs["plain"], runs["spec"]
        s = b.speculative
        plain_tps.append(a.decode_tokens_per_s)
        spec_tps.append(b.decode_tokens_per_s)
        ratios.append(b.decode_tokens_per_s / a.decode_tokens_per_s)
        per_pass = (len(b.tokens) - 1) / s.steps if s.steps else 0.0
        print(f"{r} | {a.decode_tokens_per_s:.1f} | {b.decode_tokens_per_s:.1f} | "
              f"{s.accepted}/{s.drafted} ({s.acceptance_rate:.0%}) | {per_pass:.2f} | "
              f"{a.tokens == b.tokens}")
    print(f"median: plain {statistics.median(plain_tps):.1f} tok/s, speculative "
          f"{statistics.median(spec_tps):.1f} tok/s, speed-up {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
