"""Every parameter of the simulated engine, in one place.

The defaults describe an ~8B dense model (Llama-3-8B shape: 32 layers, 8 KV heads of 128, bf16)
on one H100/H200-class GPU, served the way SGLang serves it: continuous batching, prefill steps
and decode steps taking turns (no mixed chunks), chunked prefill, a radix KV cache with LRU
eviction. Calibration against real SGLang comes later; until then these are estimates from the
hardware's rates:

- prefill is compute-bound: 2 x 8e9 FLOPs per token at ~350 TFLOP/s achieved -> ~45 us/token;
  attention adds 4 x layers x d_model FLOPs per (new token, context token) pair: ~1.5 ns;
- decode is memory-bound: each step reads the weights (16 GB at ~4 TB/s, ~4 ms, in the fixed
  cost) plus each sequence's KV (128 KiB per context token: ~32 ns per token) and a little
  per-sequence work (sampling, bookkeeping);
- the KV cache holds what is left of 80 GB after the weights and activations: ~400k tokens.

Override any field: ``EngineConfig(prefill_token_s=3e-5)`` or, on the command line of the server
and the benchmark, ``--set prefill_token_s=3e-5``. The market's knobs (reserve, overhead tokens,
in-batch deferral, ...) are not here: they are the contract's ``MarketKnobs``, which ``--set``
also reaches (``settings_split``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.contract.knobs import KNOB_NAMES, MarketKnobs, assigned


@dataclass(frozen=True)
class EngineConfig:
    """The simulated engine's capacity, scheduler limits and step-time cost model."""

    # --- step-time cost model (seconds) ---
    step_fixed_s: float = 0.004  # per forward pass: weights read, launches, scheduler overhead
    prefill_token_s: float = 4.5e-5  # per prefilled (uncached) token
    prefill_attention_s: float = 1.5e-9  # per (new token x context token) pair in prefill
    decode_seq_s: float = 2.0e-5  # per decoding sequence per step
    decode_context_token_s: float = 3.2e-8  # per context token read per decoding sequence

    # --- memory and scheduler limits (tokens, requests), SGLang's names ---
    kv_capacity_tokens: int = 400_000
    max_running_requests: int = 512
    max_prefill_tokens: int = 16_384  # prefill tokens per step across requests
    chunked_prefill_size: int = 8_192  # a longer prefill is split into chunks of this size

    # --- policy behaviour ---
    lpm_fcfs_fallback: bool = False  # SGLang's lpm turns into fcfs above 128 waiting requests
    lpm_fallback_threshold: int = 128

    def prefill_step_s(self, chunks: list[tuple[int, int]]) -> float:
        """Duration of a prefill step: (new tokens, context before them) per request."""
        new = sum(n for n, _ in chunks)
        pairs = sum(n * (ctx + n / 2) for n, ctx in chunks)
        return self.step_fixed_s + new * self.prefill_token_s + pairs * self.prefill_attention_s

    def decode_step_s(self, seqs: int, context_tokens: int) -> float:
        """Duration of a decode step of ``seqs`` sequences holding ``context_tokens`` in all."""
        return (
            self.step_fixed_s
            + seqs * self.decode_seq_s
            + context_tokens * self.decode_context_token_s
        )

    @property
    def prefill_tokens_per_second(self) -> float:
        """The planning rate the mechanism uses for completions (a long prefill step's rate)."""
        n = self.chunked_prefill_size
        return n / (self.prefill_step_s([(n, 0)]))


def settings_split(
    assignments: list[str] | tuple[str, ...], knobs: MarketKnobs
) -> tuple[EngineConfig, MarketKnobs]:
    """The engine config and the market knobs with ``--set name=value`` texts applied: a name of
    the knobs changes the knobs, any other the engine config (ValueError if it is neither)."""
    mine = [a for a in assignments if a.partition("=")[0].strip() not in KNOB_NAMES]
    theirs = [a for a in assignments if a.partition("=")[0].strip() in KNOB_NAMES]
    return assigned(EngineConfig(), mine, what="engine"), assigned(knobs, theirs, what="market")
