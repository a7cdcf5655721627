"""Tests of verispec/core/engine.py: the loop, its stop conditions and its errors.

The loop is driven through ``verispec.SpeculativeDecoder`` (verispec/decoder.py), the
core decoder with the package's default drafter and verifier policy, which these tests
also cover (the defaults by temperature, ``kernels=``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import torch

from verispec import SpeculativeDecoder
from verispec.core import DecodeState, DraftTree, GenerationParams, LanguageModel, StepOutcome
from verispec.core.types import BaseDrafter
from verispec.errors import ConfigError, ContextLengthError, IncompatibleModelsError
from verispec.verifiers import Greedy, RecursiveRejection


class CountingModel:
    """A fake target whose greedy next token after ``t`` is ``(t + 1) % V``.

    It records what it is fed, so the tests can check the engine's calls.
    """

    def __init__(self, vocab_size: int = 7, max_length: int = 64) -> None:
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.committed: list[int] = []
        self.tree: DraftTree | None = None

    @property
    def num_committed(self) -> int:
        return len(self.committed)

    def prefill(self, ids: torch.Tensor) -> None:
        self.committed = ids.tolist()

    def forward_tree(self, tree: DraftTree, *, extend_from: int = 0) -> torch.Tensor:
        assert len(self.committed) + tree.num_nodes <= self.max_length
        self.tree = tree
        last = [self.committed[-1], *tree.tokens.tolist()]
        logits = torch.full((tree.num_nodes + 1, self.vocab_size), -5.0)
        logits[torch.arange(len(last)), (torch.tensor(last) + 1) % self.vocab_size] = 5.0
        return logits

    def commit(self, accepted: Sequence[int], extra_token: int) -> None:
        assert self.tree is not None
        self.committed += [int(self.tree.tokens[i]) for i in accepted] + [extra_token]

    def reset(self) -> None:
        self.committed = []


class OracleDrafter:
    """Proposes the true continuation of length ``depth`` plus one wrong sibling at each level."""

    needs_draft_model = False

    def __init__(self, vocab_size: int, depth: int) -> None:
        self.vocab_size, self.depth = vocab_size, depth
        self.observed = 0

    def begin(self, state: DecodeState) -> None:
        self.observed = 0

    def propose(self, state: DecodeState) -> DraftTree:
        tokens, parents, parent, t = [], [], -1, state.tokens[-1]
        for _ in range(self.depth):
            wrong = (t + 3) % self.vocab_size
            t = (t + 1) % self.vocab_size
            tokens += [wrong, t]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return DraftTree.from_parents(tokens, parents)

    def observe(self, outcome: StepOutcome) -> None:
        self.observed += 1


def test_autoregressive_decodes_one_token_per_step() -> None:
    """With no drafter every step commits exactly the target's greedy token."""
    model = CountingModel()
    result = SpeculativeDecoder(model).generate([2], max_new_tokens=5)
    assert result.tokens == [3, 4, 5, 6, 0]
    assert [s.committed for s in result.steps] == [1] * 5
    assert result.mean_accepted_tokens == 1.0
    assert result.finish_reason == "max_new_tokens"


def test_oracle_drafter_accepts_whole_path_through_side_branch() -> None:
    """A correct path stored as the second child is accepted whole, plus the bonus token."""
    model, drafter = CountingModel(), OracleDrafter(7, depth=3)
    result = SpeculativeDecoder(model, drafter, verifier=Greedy()).generate([0], max_new_tokens=8)
    assert result.tokens == [1, 2, 3, 4, 5, 6, 0, 1]
    assert [s.committed for s in result.steps] == [4, 4]
    assert result.mean_accepted_tokens == 4.0
    assert drafter.observed == 2


def test_eos_stops_and_is_kept() -> None:
    """Generation stops right after an end-of-sequence token, even mid-path."""
    model = CountingModel()
    decoder = SpeculativeDecoder(model, OracleDrafter(7, depth=3), verifier=Greedy())
    result = decoder.generate([0], max_new_tokens=20, eos_token_ids=[2])
    assert result.tokens == [1, 2]
    assert result.finish_reason == "eos"


def test_max_new_tokens_truncates_a_long_accepted_path() -> None:
    """Tokens accepted past max_new_tokens are not returned."""
    decoder = SpeculativeDecoder(CountingModel(), OracleDrafter(7, depth=4), verifier=Greedy())
    assert decoder.generate([0], max_new_tokens=3).tokens == [1, 2, 3]


def test_context_end_truncates_tree_then_stops() -> None:
    """Near the context limit the tree is cut to fit and generation ends with "length"."""
    model = CountingModel(max_length=6)
    decoder = SpeculativeDecoder(model, OracleDrafter(7, depth=3), verifier=Greedy())
    result = decoder.generate([0, 1], max_new_tokens=50)
    assert result.finish_reason == "length"
    assert len(model.committed) == model.max_length + 1
    assert result.tokens == [2, 3, 4, 5, 6]


def test_verifier_policy_picks_by_temperature() -> None:
    """The default policy verifies greedily at temperature 0 and by rejection otherwise."""
    decoder = SpeculativeDecoder(CountingModel())
    assert isinstance(decoder.verifier_for(GenerationParams().sampling), Greedy)
    sampled = decoder.verifier_for(GenerationParams(temperature=0.7).sampling)
    assert not isinstance(sampled, Greedy)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_bad_generation_config_is_rejected(kwargs: dict, match: str) -> None:
    """Out-of-range settings raise ConfigError naming the argument."""
    with pytest.raises(ConfigError, match=match):
        GenerationParams(**kwargs)


def test_empty_prompt_is_rejected() -> None:
    """An empty prompt raises a ConfigError instead of decoding from nothing."""
    with pytest.raises(ConfigError, match="prompt"):
        SpeculativeDecoder(CountingModel()).generate([], max_new_tokens=3)


def test_prompt_longer_than_context_is_rejected() -> None:
    """A prompt that fills the context raises ContextLengthError with both lengths."""
    with pytest.raises(ContextLengthError, match="8 tokens"):
        SpeculativeDecoder(CountingModel(max_length=8)).generate([1] * 8, max_new_tokens=3)


def test_prompt_token_out_of_vocabulary_is_rejected() -> None:
    """Token ids outside the model's vocabulary are refused up front."""
    with pytest.raises(ConfigError, match=r"\[0, 7\)"):
        SpeculativeDecoder(CountingModel()).generate([9], max_new_tokens=3)


def test_tokenizer_larger_than_model_vocabulary_is_rejected() -> None:
    """A tokenizer with more tokens than the model's vocabulary cannot be paired with it."""

    class BigTokenizer:
        def __len__(self) -> int:
            return 100

        def encode(self, text: str) -> list[int]:
            return [1]

        def decode(self, ids: list[int]) -> str:
            return ""

    with pytest.raises(IncompatibleModelsError, match="100 tokens"):
        SpeculativeDecoder(CountingModel(), tokenizer=BigTokenizer())


class _Bound(BaseDrafter):
    """A drafter that declares the optional capabilities: a draft model and a binding."""

    def __init__(self, draft: CountingModel) -> None:
        self.draft = draft
        self.bound: LanguageModel | None = None

    def bind_target(self, target: LanguageModel) -> None:
        self.bound = target

    def propose(self, state: DecodeState) -> DraftTree:
        return DraftTree.empty()


def test_the_decoder_reads_a_drafters_declared_capabilities() -> None:
    """A drafter on ``BaseDrafter`` is bound to the target when the decoder is built and its
    draft model's vocabulary is checked; one that only follows the protocol has the defaults
    and decodes as well."""
    model = CountingModel()
    drafter = _Bound(CountingModel())
    SpeculativeDecoder(model, drafter)
    assert drafter.bound is model
    with pytest.raises(IncompatibleModelsError, match="vocabulary must match"):
        SpeculativeDecoder(model, _Bound(CountingModel(vocab_size=8)))
    result = SpeculativeDecoder(model, OracleDrafter(7, depth=1), verifier=Greedy()).generate(
        [0], max_new_tokens=4
    )
    assert result.tokens == [1, 2, 3, 4]


def test_kernels_choice_reaches_the_default_verifiers() -> None:
    """``kernels=`` given to the decoder reaches the verifier the default policy builds at
    each temperature (at T > 0, the recursive rule the coupled one falls back to), and a bad
    value is refused when the decoder is built."""
    for kernels in ("torch", "auto"):
        decoder = SpeculativeDecoder(CountingModel(), kernels=kernels)
        for temperature in (0.0, 0.7):
            verifier = decoder.verifier_for(GenerationParams(temperature=temperature).sampling)
            verifier = getattr(verifier, "fallback", verifier)
            assert verifier.kernels == kernels  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="`kernels` must be one of"):
        SpeculativeDecoder(CountingModel(), kernels="fast")


class _OnCuda(CountingModel):
    """The counting model claiming to live on a CUDA device."""

    device = torch.device("cuda", 0)


def test_clocks_synchronise_a_cuda_target_only_when_asked(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With ``VERISPEC_PHASE_SYNC=1`` every clock read of a generation on a CUDA target
    synchronises that device first (the prefill's two, six per step, the total's one), so
    kernel time lands in the phase that launched it; by default (and with ``0``) the engine's
    clocks synchronise nothing, so a step waits for the device only where it reads the
    verdict; a CPU target (no ``device``, or a CPU one) is never synchronised."""
    from verispec.core.engine import PHASE_SYNC_ENV

    synced: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setenv(PHASE_SYNC_ENV, "1")
    result = SpeculativeDecoder(_OnCuda(), OracleDrafter(7, 2)).generate([1, 2], max_new_tokens=9)
    assert synced == [torch.device("cuda", 0)] * (2 + 6 * result.num_steps + 1)
    synced.clear()
    for setting in (None, "0"):
        if setting is None:
            monkeypatch.delenv(PHASE_SYNC_ENV)
        else:
            monkeypatch.setenv(PHASE_SYNC_ENV, setting)
        SpeculativeDecoder(_OnCuda(), OracleDrafter(7, 2)).generate([1, 2], max_new_tokens=9)
        assert synced == []
    monkeypatch.setenv(PHASE_SYNC_ENV, "1")
    cpu_model = CountingModel()
    cpu_model.device = torch.device("cpu")  # type: ignore[attr-defined]
    for model in (CountingModel(), cpu_model):
        SpeculativeDecoder(model, OracleDrafter(7, 2)).generate([1, 2], max_new_tokens=9)
    assert synced == []


def test_commit_is_its_own_phase(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The time the target spends committing the accepted path is the step's ``commit_s``
    (and ``time_split()["commit"]``), not drafting time: on a fake clock that ticks once a
    read and that the model's commit moves on by 100, every step has ``commit_s == 101``
    and ``draft_s == 2`` (propose and observe, one tick each)."""
    now = [0.0]

    def tick() -> float:
        now[0] += 1.0
        return now[0]

    class SlowCommit(CountingModel):
        def commit(self, accepted: Sequence[int], extra_token: int) -> None:
            now[0] += 100.0
            super().commit(accepted, extra_token)

    monkeypatch.setattr(time, "perf_counter", tick)
    result = SpeculativeDecoder(SlowCommit(), OracleDrafter(7, 2), Greedy()).generate(
        [1, 2], max_new_tokens=9
    )
    assert result.num_steps > 1
    assert [s.commit_s for s in result.steps] == [101.0] * result.num_steps
    assert [s.draft_s for s in result.steps] == [2.0] * result.num_steps
    assert result.time_split()["commit"] == 101.0 * result.num_steps


class _Policy:
    """A verifier policy that returns something that is not a verifier."""

    def __call__(self, sampling: object) -> object:
        return "greedy"


def _decoder(**kwargs: object) -> SpeculativeDecoder:
    return SpeculativeDecoder(CountingModel(), **kwargs)  # type: ignore[arg-type]


# (what is wrong, the call, the exception type, the argument the message must name)
BAD_API_INPUT = [
    ("drafter given by name", lambda: SpeculativeDecoder(CountingModel(), "tr"), "drafter"),
    ("drafter class", lambda: _decoder(drafter=OracleDrafter), "drafter"),
    ("verifier by name", lambda: _decoder(verifier="x"), "verifier"),
    ("verifier class", lambda: _decoder(verifier=RecursiveRejection), "verifier"),
    ("target not a model", lambda: SpeculativeDecoder("smollm2"), "target"),
    ("tokenizer without encode", lambda: _decoder(tokenizer=object()), "tokenizer"),
    ("config as a dict", lambda: _decoder().generate([1], {"max_new_tokens": 3}), "config"),
    ("unknown setting", lambda: _decoder().generate([1], max_tokens=3), "max_tokens"),
    ("float tensor prompt", lambda: _decoder().generate(torch.tensor([1.5, 2.0])), "prompt"),
    ("2-D prompt", lambda: _decoder().generate(torch.tensor([[1, 2], [3, 4]])), "prompt"),
    ("nested list prompt", lambda: _decoder().generate([[1, 2], [3, 4]]), "prompt"),
    ("float list prompt", lambda: _decoder().generate([1.5, 2.0]), "prompt"),
    ("bool tensor prompt", lambda: _decoder().generate(torch.tensor([True])), "prompt"),
    ("prompt of no kind", lambda: _decoder().generate(None), "prompt"),
    ("seed 2**70", lambda: _decoder().generate([1], seed=2**70), "seed"),
    ("seed 1.5", lambda: _decoder().generate([1], seed=1.5), "seed"),
    ("seed None", lambda: GenerationParams(seed=None), "seed"),
    ("seed -1", lambda: GenerationParams(seed=-1), "seed"),
    ("seed True", lambda: GenerationParams(seed=True), "seed"),
    ("eos id -1", lambda: GenerationParams(eos_token_ids=[-1]), "eos_token_ids"),
    ("eos id not an int", lambda: GenerationParams(eos_token_ids=["</s>"]), "eos_token_ids"),
    ("eos id >= V", lambda: _decoder().generate([1], eos_token_ids=[7]), "eos_token_ids"),
    ("empty stop string", lambda: GenerationParams(stop_strings=[""]), "stop_strings"),
    ("stop string not a str", lambda: GenerationParams(stop_strings=[3]), "stop_strings"),
    ("temperature NaN", lambda: GenerationParams(temperature=float("nan")), "temperature"),
    ("top_p above 1", lambda: GenerationParams(top_p=1.5), "top_p"),
    ("min_p of 1", lambda: GenerationParams(min_p=1.0), "min_p"),
    ("max_new_tokens 2.5", lambda: GenerationParams(max_new_tokens=2.5), "max_new_tokens"),
    ("policy returns junk", lambda: _decoder(verifier=_Policy()).generate([1]), "verifier"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "call", "name"), BAD_API_INPUT, ids=[b[0] for b in BAD_API_INPUT])
def test_bad_api_input_is_a_config_error_naming_the_argument(what, call, name) -> None:
    """Each bad input to the public API raises ConfigError (a ValueError) at the call that
    takes it, and the message names the argument between backticks."""
    with pytest.raises(ConfigError) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert f"`{name}`" in str(info.value), str(info.value)


class _Reserving(CountingModel):
    """The counting model with the optional ``reserve`` capability, recording its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.reserved: list[int] = []

    def reserve(self, tokens: int) -> None:
        self.reserved.append(tokens)


def test_a_target_that_can_reserve_is_told_the_longest_context() -> None:
    """Before each generation the decoder tells a target offering ``reserve`` the prompt length
    plus max_new_tokens; a target without it is not asked."""
    model = _Reserving()
    decoder = SpeculativeDecoder(model, OracleDrafter(7, 2))
    decoder.generate([1, 2, 3], max_new_tokens=9)
    decoder.generate([4], max_new_tokens=5)
    assert model.reserved == [12, 6]
    SpeculativeDecoder(CountingModel()).generate([1, 2], max_new_tokens=3)  # no reserve: fine


class _DigitTokenizer:
    """Token ``t`` decodes to the digit ``str(t)``; ``len`` is the vocabulary."""

    eos_token_id = None

    def __len__(self) -> int:
        return 7

    def encode(self, text: str) -> list[int]:
        return [int(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(str(int(i)) for i in ids)


@pytest.mark.parametrize(("max_new", "eos"), [(11, None), (4, None), (20, [5])])
def test_stream_yields_exactly_the_tokens_and_text_of_generate(
    max_new: int, eos: list | None
) -> None:
    """``stream`` yields one chunk per step whose tokens and text concatenate to ``generate``'s
    tokens and text, cut at the stop condition, and only the last chunk carries the result."""
    options = {"max_new_tokens": max_new, "eos_token_ids": eos}
    decoder = SpeculativeDecoder(CountingModel(), OracleDrafter(7, 2), tokenizer=_DigitTokenizer())
    expected = decoder.generate([1, 2], **options)
    chunks = list(decoder.stream([1, 2], **options))
    assert len(chunks) == expected.num_steps
    assert [t for c in chunks for t in c.tokens] == expected.tokens
    assert "".join(c.text or "" for c in chunks) == expected.text
    assert all(c.result is None for c in chunks[:-1])
    last = chunks[-1].result
    assert last is not None and last.tokens == expected.tokens
    assert last.finish_reason == expected.finish_reason
    assert [c.step for c in chunks] == last.steps


def test_on_step_receives_each_steps_committed_tokens() -> None:
    """``generate(on_step=...)`` is called once per step with the tokens that step added."""
    seen: list[list[int]] = []
    decoder = SpeculativeDecoder(CountingModel(), OracleDrafter(7, 3))
    result = decoder.generate([1], max_new_tokens=10, on_step=seen.append)
    assert len(seen) == result.num_steps
    assert [t for tokens in seen for t in tokens] == result.tokens
    assert [len(s) for s in seen[:-1]] == [step.committed for step in result.steps[:-1]]


def test_time_held_by_a_stream_consumer_is_not_counted() -> None:
    """Seconds the consumer spends between chunks are left out of the result's ``total_s``."""
    import time

    decoder = SpeculativeDecoder(CountingModel(), OracleDrafter(7, 1))
    result = None
    for chunk in decoder.stream([1], max_new_tokens=6):
        time.sleep(0.2)
        result = chunk.result or result
    assert result is not None and result.num_steps >= 3  # >= 0.4 s held between chunks
    assert result.total_s < 0.2  # less than one pause: none was counted


def test_stream_text_with_a_byte_level_tokenizer_equals_generate() -> None:
    """With a real byte-level tokenizer, whose tokens split UTF-8 characters, the streamed
    texts concatenate to ``generate``'s text (incomplete characters held back, none lost)."""
    from saved_models import byte_tokenizer

    from verispec.drafters import PromptLookup
    from verispec.models import tiny_llama

    tokenizer = byte_tokenizer()
    model = tiny_llama(vocab_size=len(tokenizer), hidden_size=32, num_layers=1, seed=4)
    decoder = SpeculativeDecoder(model, PromptLookup(), tokenizer=tokenizer)
    prompt = tokenizer.encode("héllo wörld, héllo wörld")
    expected = decoder.generate(prompt, max_new_tokens=40, eos_token_ids=[])
    chunks = list(decoder.stream(prompt, max_new_tokens=40, eos_token_ids=[]))
    assert any(ord(c) > 127 for c in expected.text or "")  # multi-byte text was produced
    assert "".join(c.text or "" for c in chunks) == expected.text
    assert [t for c in chunks for t in c.tokens] == expected.tokens


def test_a_context_too_short_for_max_new_tokens_warns_and_stops_where_it_said() -> None:
    """When the prompt leaves room for fewer tokens than max_new_tokens, a warning says how
    many fit (as transformers warns), and generation stops there with 'length'; with room
    enough, nothing is warned."""
    import warnings

    decoder = _decoder()
    prompt = [1, 2, 3, 4, 5, 6] * 3
    fit = decoder.target.max_length - len(prompt) + 1
    with pytest.warns(UserWarning, match=f"leave room for {fit} new tokens") as caught:
        result = decoder.generate(prompt, max_new_tokens=fit + 50, eos_token_ids=[])
    assert len(caught) == 1
    assert result.finish_reason == "length" and len(result.tokens) == fit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder.generate(prompt, max_new_tokens=fit, eos_token_ids=[])


def test_a_batch_of_one_prompt_is_that_prompt() -> None:
    """A (1, S) tensor (a tokenizer's ``return_tensors="pt"``) generates what the (S,) one
    does; a batch of two is still refused (one sequence per call)."""
    ids = [1, 2, 3]
    flat = _decoder().generate(torch.tensor(ids), max_new_tokens=6)
    assert _decoder().generate(torch.tensor([ids]), max_new_tokens=6).tokens == flat.tokens
    with pytest.raises(ConfigError, match=r"Shape: \(S,\) or \(1, S\); got a tensor of shape"):
        _decoder().generate(torch.tensor([ids, ids]))


@pytest.mark.parametrize("entry", ["generate", "stream", "GenerationParams"])
def test_stop_strings_without_a_tokenizer_are_refused_not_ignored(entry: str) -> None:
    """Stop strings are matched on decoded text: a decoder without a tokenizer refuses them
    with the one error every entry point raises (it used to run to max_new_tokens), from
    keyword overrides and from a config alike, before anything is generated."""
    decoder = SpeculativeDecoder(CountingModel(), OracleDrafter(7, 4))
    with pytest.raises(ConfigError, match=r"`stop_strings` \['45'\] need the model's tokenizer"):
        if entry == "generate":
            decoder.generate([1], max_new_tokens=30, stop_strings=["45"])
        elif entry == "stream":
            next(iter(decoder.stream([1], max_new_tokens=30, stop_strings=["45"])))
        else:
            decoder.generate([1], GenerationParams(max_new_tokens=30, stop_strings=["45"]))
    assert decoder.generate([1], max_new_tokens=3).finish_reason == "max_new_tokens"


def test_a_stop_string_ends_the_tokens_at_the_token_that_completes_it() -> None:
    """With a stop string, the answer's tokens end with the token completing it, even when the
    step committed more, and the streamed chunks end there too."""
    decoder = SpeculativeDecoder(CountingModel(), OracleDrafter(7, 4), tokenizer=_DigitTokenizer())
    result = decoder.generate([1], max_new_tokens=30, stop_strings=["45"])
    assert result.finish_reason == "stop_string"
    assert result.text is not None and result.text.endswith("45") and result.text.count("45") == 1
    assert decoder.tokenizer.decode(result.tokens) == result.text
    assert sum(step.committed for step in result.steps) > len(result.tokens)  # some dropped
    chunks = list(decoder.stream([1], max_new_tokens=30, stop_strings=["45"]))
    assert [t for c in chunks for t in c.tokens] == result.tokens
