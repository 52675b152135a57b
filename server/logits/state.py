"""RowState: one sequence's logits processing, owned by the model's thread - its grammar matcher, its
penalties and bias, and the tokens the model's thread has sampled for it. The scheduler plans a step
before the last one's tokens are delivered, and discards tokens of sequences preempted or ended
meanwhile, so every step first brings the state to the number of tokens the sequence will have
(`sync`): tokens beyond it are dropped from the counts at once, and from the matcher (rolled back) by
`advance`, which also feeds the matcher the tokens it has not seen - on the masks thread, beside the
forward pass, never at the same time as the model's thread touches the matcher. A matcher that fails (a
per-step limit outgrown, a token it cannot take) keeps its error in `failure`, which the step reports: the
stream ends with that error, not with the EOS its mask then allows."""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch


class RowState:
    __slots__ = (
        "bias_ids",
        "bias_values",
        "consumed",
        "counts",
        "failure",
        "frequency",
        "matcher",
        "presence",
        "prompt_seen",
        "repetition",
        "tokens",
    )

    def __init__(
        self,
        *,
        vocab_size: int,
        device: torch.device,
        prompt: Sequence[int],
        matcher: llguidance.LLMatcher | None = None,
        presence: float = 0.0,
        frequency: float = 0.0,
        repetition: float = 1.0,
        logit_bias: Sequence[tuple[int, float]] = (),
    ) -> None:
        self.matcher = matcher
        self.presence, self.frequency, self.repetition = presence, frequency, repetition
        self.tokens: list[int] = []
        self.consumed = 0  # tokens the matcher has taken (it may lag `tokens`, or lead it until advance)
        self.failure: str | None = None  # the matcher's error, once it has failed (set on the masks thread)
        penalised = presence != 0 or frequency != 0 or repetition != 1
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device) if penalised else None
        self.prompt_seen: torch.Tensor | None = None
        if repetition != 1:
            self.prompt_seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            if prompt:
                self.prompt_seen[torch.tensor(list(prompt), dtype=torch.long, device=device)] = True
        self.bias_ids = self.bias_values = None
        if logit_bias:
            self.bias_ids = torch.tensor([t for t, _ in logit_bias], dtype=torch.long, device=device)
            self.bias_values = torch.tensor([b for _, b in logit_bias], dtype=torch.float32, device=device)

    @property
    def penalised(self) -> bool:
        return self.counts is not None

    def sync(self, generated: int) -> None:
        """Forgets the tokens sampled beyond the `generated` the sequence will have (discarded ones)."""
        extra = len(self.tokens) - generated
        if extra <= 0:
            return
        dropped = self.tokens[generated:]
        del self.tokens[generated:]
        if self.counts is not None:
            for token in dropped:
                self.counts[token] -= 1

    def accept(self, token: int) -> None:
        self.tokens.append(token)
        if self.counts is not None:
            self.counts[token] += 1

    def advance(self) -> None:
        """The matcher to exactly `tokens` (masks thread): back over dropped ones, on over new ones."""
        matcher = self.matcher
        assert matcher is not None
        if self.consumed > len(self.tokens):
            if not matcher.is_error():
                matcher.rollback(self.consumed - len(self.tokens))
            self.consumed = len(self.tokens)
        for token in self.tokens[self.consumed :]:
            if matcher.is_stopped() or matcher.is_error():
                break
            matcher.consume_token(token)
        self.consumed = len(self.tokens)

    def check(self) -> None:
        """Keeps the matcher's error once it fails (masks thread, after its mask): llguidance's own text,
        its first line only (the rest dumps the tokens and the grammar)."""
        matcher = self.matcher
        if self.failure is None and matcher is not None and matcher.is_error():
            self.failure = matcher.get_error().split("\n", 1)[0].strip() or "the grammar's matcher failed"

    @property
    def ended(self) -> bool:
        """The matcher can take nothing more (its EOS was consumed, or it failed): only EOS is allowed."""
        return self.matcher is not None and (self.matcher.is_stopped() or self.matcher.is_error())
