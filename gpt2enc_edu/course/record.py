"""The record of the checks run on this machine, and ``report()``: which passed, for a learner and an instructor.

Every check appends one JSON line to the record file: ``$GPT2ENC_EDU_RECORD`` when that variable is set, else
``~/.gpt2enc_edu/checks.jsonl``. A line holds the check's name and notebook, the form (``per-thread Python``
and ``CUDA`` are graded in a separate process; ``in-process`` marks the arithmetic exercises, checked in the
notebook's own process), where it ran, the status (``correct``, ``failed``, ``not done``, ``refused``, ``no
GPU``), a short message, the time (UTC) and the seconds the graded run took.

``report()`` prints one line per check (passed or not, with the time of its first pass) and returns the rows;
``report(save="my_checks.json")`` also writes them, with the machine's name and the record's path, as one
JSON file to hand in. The record is a convenience, not a proof: it lives on the learner's machine, which can
edit it. An instructor who needs proof grades the learner's submitted kernels again on a machine of their own.
"""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

#: The notebook of each check (the graded kernels, the warm-ups and the arithmetic exercises).
NOTEBOOK = {"add_bias": "00", "warp_sum": "00", "block_sum": "00", "forward": "01", "atomic": "02", "wpe": "03",
            "wte_bucketed": "03", "exercise 1": "01", "exercise 2": "02", "exercise 3": "03", "exercise 4": "04",
            "exercise 5": "05", "exercise 6": "06"}
_warned = False


def path() -> Path:
    """The record file (see the module docstring)."""
    override = os.environ.get("GPT2ENC_EDU_RECORD")
    return Path(override) if override else Path.home() / ".gpt2enc_edu" / "checks.jsonl"


def add(check: str, form: str, verdict, *, file=None) -> None:
    """Append one check's outcome (to ``file``, else ``path()``); a record that cannot be written warns once and
    never fails the check."""
    global _warned
    status = getattr(verdict, "status", "") or ("correct" if verdict else "failed")
    where = ("no GPU here" if status == "no GPU" else "GPU" if form == "CUDA" else
             "CPU (grid emulator)" if form == "per-thread Python" else "notebook")
    line = {"check": check, "notebook": NOTEBOOK.get(check, ""), "form": form, "ran_on": where,
            "status": status,
            "message": str(getattr(verdict, "message", ""))[:300],
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(float(getattr(verdict, "seconds", 0.0)), 2)}
    try:
        target = Path(file) if file else path()
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError as exc:
        if not _warned:
            print(f"(the check could not be recorded in {file or path()}: {exc})")
            _warned = True


def read(file=None) -> list[dict]:
    """Every recorded line, oldest first (lines that are not JSON are skipped)."""
    target = Path(file) if file else path()
    if not target.is_file():
        return []
    lines = []
    for text in target.read_text().splitlines():
        try:
            entry = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "check" in entry:
            lines.append(entry)
    return lines


def summary(lines: list[dict]) -> list[dict]:
    """One row per (check, form): passed or not, the first pass's time, the last outcome, attempts."""
    rows: dict[tuple, dict] = {}
    for entry in lines:
        key = (entry["check"], entry.get("form", ""))
        row = rows.setdefault(key, {"check": entry["check"], "notebook": entry.get("notebook", ""),
                                    "form": key[1], "ran_on": entry.get("ran_on", ""), "passed": False,
                                    "first_pass": None, "last_status": "", "last_time": "", "attempts": 0})
        row["attempts"] += 1
        row["last_status"], row["last_time"] = entry.get("status", ""), entry.get("time", "")
        if entry.get("status") == "correct" and not row["passed"]:
            row["passed"], row["first_pass"], row["ran_on"] = True, entry.get("time"), entry.get("ran_on", "")
    return sorted(rows.values(), key=lambda r: (r["notebook"], r["check"], r["form"]))


def report(*, file=None, save=None) -> list[dict]:
    """Print which checks passed (one line each) and return the rows; ``save``: also write them as JSON there."""
    rows = summary(read(file))
    source = Path(file) if file else path()
    if not rows:
        print(f"No checks recorded yet in {source}.")
    else:
        print(f"Checks recorded in {source} ({sum(r['passed'] for r in rows)} of {len(rows)} passed):")
        for r in rows:
            state = f"passed {r['first_pass']}" if r["passed"] else f"not passed (last: {r['last_status']})"
            print(f"  {r['notebook'] or '--'}  {r['check']:<13} {r['form']:<18} {state}, on {r['ran_on']}, "
                  f"{r['attempts']} attempt{'s' if r['attempts'] != 1 else ''}")
    if save is not None:
        Path(save).write_text(json.dumps({"machine": platform.node(), "record": str(source), "checks": rows},
                                         indent=1) + "\n")
        print(f"Written to {save}.")
    return rows
