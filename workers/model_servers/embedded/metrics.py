"""Prometheus text for /metrics, with vLLM's metric names so readers never branch."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class ServerMetrics:
    model: str
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_ok: int = 0
    requests_running: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    #: engine steps run at each draft depth K (0 = plain steps), and the K of the last one
    rounds_by_k: dict[int, int] = field(default_factory=dict)
    speculation_k: int | None = None
    #: engine steps run in each decoding ("tree", "chain+adaptive", ...; "plain": K = 0)
    steps_by_decoding: dict[str, int] = field(default_factory=dict)
    #: the thread plan it was started with (foundation/host/threads.py)
    torch_threads: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_spec(self, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> None:
        with self.lock:
            self.num_drafts += drafts
            self.num_draft_tokens += draft_tokens
            self.num_accepted_tokens += accepted
            if len(per_pos) > len(self.accepted_per_pos):
                self.accepted_per_pos += [0] * (len(per_pos) - len(self.accepted_per_pos))
            for i, n in enumerate(per_pos):
                self.accepted_per_pos[i] += n

    def set_rounds(self, rounds_by_k: dict[int, int], last_k: int | None) -> None:
        with self.lock:
            self.rounds_by_k, self.speculation_k = dict(rounds_by_k), last_k

    def set_steps(self, steps_by_decoding: dict[str, int]) -> None:
        with self.lock:
            self.steps_by_decoding = dict(steps_by_decoding)

    def _render_schedule(self, lines: list[str], label: str) -> None:
        """EagleNest's own series: torch threads; steps per decoding; steps per draft depth
        K, the last K."""
        if self.torch_threads is not None:
            lines.append("# TYPE eaglenest:torch_threads gauge")
            lines.append(f"eaglenest:torch_threads{{{label}}} {float(self.torch_threads)}")
        if self.steps_by_decoding:
            lines.append("# TYPE eaglenest:decoding_steps_total counter")
            for name, n in sorted(self.steps_by_decoding.items()):
                lines.append(f'eaglenest:decoding_steps_total{{{label},decoding="{name}"}} '
                             f"{float(n)}")
        if not self.rounds_by_k:
            return
        lines.append("# TYPE eaglenest:speculation_rounds_total counter")
        for k, n in sorted(self.rounds_by_k.items()):
            lines.append(f'eaglenest:speculation_rounds_total{{{label},k="{k}"}} {float(n)}')
        if self.speculation_k is not None:
            lines.append("# TYPE eaglenest:speculation_k gauge")
            lines.append(f"eaglenest:speculation_k{{{label}}} {float(self.speculation_k)}")

    def render(self) -> str:
        label = f'model_name="{self.model}"'
        lines = []

        def counter(name: str, value: int, extra: str = "") -> None:
            lines.append(f"# TYPE vllm:{name} counter")
            labels = label + (f",{extra}" if extra else "")
            lines.append(f"vllm:{name}{{{labels}}} {float(value)}")

        with self.lock:
            counter("prompt_tokens_total", self.prompt_tokens)
            counter("generation_tokens_total", self.generation_tokens)
            counter("request_success_total", self.requests_ok)
            lines.append("# TYPE vllm:num_requests_running gauge")
            lines.append(f"vllm:num_requests_running{{{label}}} {float(self.requests_running)}")
            counter("spec_decode_num_drafts_total", self.num_drafts)
            counter("spec_decode_num_draft_tokens_total", self.num_draft_tokens)
            counter("spec_decode_num_accepted_tokens_total", self.num_accepted_tokens)
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
            for pos, n in enumerate(self.accepted_per_pos):
                lines.append(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},'
                    f'position="{pos}"}} {float(n)}'
                )
            self._render_schedule(lines, label)
        return "\n".join(lines) + "\n"


def parse_torch_threads(text: str) -> int | None:
    """The embedded server's torch threads from its /metrics page (None: not shown)."""
    for line in text.splitlines():
        if line.startswith("eaglenest:torch_threads{"):
            return int(float(line.rpartition(" ")[2]))
    return None


def parse_rounds_by_k(text: str) -> dict[int, float]:
    """K -> engine steps run at that K, from an embedded server's /metrics page."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        if line.startswith("eaglenest:speculation_rounds_total{"):
            metric, _, value = line.rpartition(" ")
            out[int(metric.split('k="', 1)[1].split('"', 1)[0])] = float(value)
    return out


def parse_steps_by_decoding(text: str) -> dict[str, float]:
    """Decoding -> engine steps run in it ("plain": K = 0), from an embedded server's
    /metrics page ({} from a vLLM server, which serves one method)."""
    out: dict[str, float] = {}
    for name, metric, v in samples(text):
        if name == "eaglenest:decoding_steps_total":
            out[metric.split('decoding="', 1)[1].split('"', 1)[0]] = v
    return out


def samples(text: str) -> Iterator[tuple[str, str, float]]:
    """A /metrics page's samples: (name, the sample as written before its value, value);
    comments and unreadable values skipped."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        yield metric.split("{", 1)[0], metric, v


def parse_spec_counters(text: str) -> dict[str, float]:
    """Sum vLLM's spec-decode counters from a /metrics page (either backend).

    Returns keys drafts, draft_tokens, accepted and per_pos_<i>.
    """
    names = {
        "vllm:spec_decode_num_drafts_total": "drafts",
        "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    }
    out: dict[str, float] = {}
    for name, metric, v in samples(text):
        if name in names:
            out[names[name]] = out.get(names[name], 0.0) + v
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = metric.split('position="', 1)[1].split('"', 1)[0]
            out[f"per_pos_{pos}"] = out.get(f"per_pos_{pos}", 0.0) + v
    return out
