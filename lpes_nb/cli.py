"""lpes: one command for everything a user runs; `lpes COMMAND --help` describes each. `python -m lpes_nb
COMMAND` is the same command without an install (the GPU kit runs that way from a checkout)."""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module whose main() it runs, what it does)
COMMANDS = {
    "run": ("workbook.run", "run the numbered notebooks under papermill (--profile, --only, --from, --publish, --dry-run)"),
    "map": ("studies.position_map", "notebook 9's map and its record cells, record by record (resumable; --rescore)"),
    "lpes-at-power": ("studies.lpes_at_power", "notebook 10's steps: search, validate, test, in the background over sittings"),
    "fitness-proxy": ("studies.fitness_proxy", "whether a cheaper fitness ranks candidates as the real one does"),
    "throughput": ("operations.throughput", "this CPU's speed and what shared prefixes save; --record-cost for a larger model"),
    "bench": ("operations.bench", "standalone timings: latency, rope-overhead, evaluator, ray (results/)"),
    "costs": ("operations.costs", "cost plans: dry-run, memory, table, plan, larger-plan"),
    "gpu-kit": ("operations.gpu_kit", "what to run first on a lent GPU (--out DIR, --dry, --steps)"),
    "carry": ("operations.carry", "pack / verify / unpack files in checksummed parts for a machine without network"),
    "models": ("store.models", "convert the embedded models to the cache (--prepare NAME ...)"),
    "apply": ("store.stored_curve", "generate with a stored curve on a model (--transfer to move it to another depth)"),
    "claims": ("workbook.pages", "write the claims ledger, results/claims.csv, and the README's and docs' generated tables"),
    "store": ("store.results", "store maintenance: re-key stored results whose key format changed (migrate DIR)"),
    "doctor": ("system.bf16_gemm", "what this machine decided: the CPU, whether bf16 is safe, the bf16 GEMM path"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    listing = "\n".join(f"  {name:<14} {what}" for name, (_, what) in COMMANDS.items())
    parser = argparse.ArgumentParser(prog="lpes", description=__doc__.split("\n\n")[0], epilog=f"commands:\n{listing}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(COMMANDS), metavar="command", help="one of the commands below")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments (lpes COMMAND --help)")
    args = parser.parse_args(argv[:1] if argv and not argv[0].startswith("-") else argv)
    module, _ = COMMANDS[args.command]
    # each command's module is imported when it runs: `lpes --help` and light commands do not load torch
    status = importlib.import_module(f"lpes_nb.{module}").main(argv[1:])
    return int(status or 0)
