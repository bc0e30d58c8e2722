#!/usr/bin/env python3
"""Soak the ChunkStore against its model: run the state machine of
tests/store/test_store_model.py with fresh random seeds until time is up.

    python3 tools/soak_store.py --minutes 30
    python3 tools/soak_store.py --seed 1234567      # rerun one seed

Each round is one Hypothesis run of --examples examples of up to --steps
steps, under its own seed (printed, so a failure can be rerun with --seed).
Prints a line per round and a summary; on a failure prints the failing steps
and the seed, and exits 1.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from hypothesis import seed as hyp_seed
from hypothesis.stateful import run_state_machine_as_test
from test_store_model import StoreModel, model_settings

from fx100io.errors import IoUringUnavailableError


def run_one(seed: int, examples: int, steps: int) -> None:
    """One round; retried (up to 3 times) when io_uring was refused: that is
    the machine, not the store (a test elsewhere on the same machine can
    set kernel.io_uring_disabled for a moment)."""
    for attempt in range(4):
        machine = type("StoreModelSoak", (StoreModel,), {"report_first_failure": True})
        hyp_seed(seed)(machine)
        try:
            run_state_machine_as_test(machine, settings=model_settings(
                max_examples=examples, stateful_step_count=steps, derandomize=False))
            return
        except Exception:
            if attempt == 3 or not isinstance(machine.last_failure, IoUringUnavailableError):
                raise
            print(f"seed {seed}: io_uring was refused while it ran ({machine.last_failure}); "
                  "not a store failure: rerunning the round in 5 s", flush=True)
            time.sleep(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10)")
    ap.add_argument("--examples", type=int, default=10, help="examples per round (default 10)")
    ap.add_argument("--steps", type=int, default=40, help="steps per example (default 40)")
    ap.add_argument("--seed", type=int, help="run this one seed and stop")
    args = ap.parse_args()

    seeds = [args.seed] if args.seed is not None else None
    deadline = time.monotonic() + args.minutes * 60
    rounds = 0
    start = time.monotonic()
    rng = random.SystemRandom()
    while True:
        if seeds is not None:
            if not seeds:
                break
            s = seeds.pop()
        elif time.monotonic() >= deadline:
            break
        else:
            s = rng.getrandbits(48)
        t0 = time.monotonic()
        try:
            run_one(s, args.examples, args.steps)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            break
        except BaseException:
            traceback.print_exc()
            print(f"\nFAILED: round {rounds + 1}, seed {s}; rerun with: "
                  f"python3 tools/soak_store.py --seed {s} --examples {args.examples} "
                  f"--steps {args.steps}", flush=True)
            return 1
        rounds += 1
        print(f"round {rounds}: seed {s}: {args.examples} examples of up to {args.steps} "
              f"steps passed in {time.monotonic() - t0:.1f} s", flush=True)
    total = time.monotonic() - start
    print(f"summary: {rounds} rounds, {rounds * args.examples} examples, no failure, "
          f"in {total / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
