"""verispec's lossless speculative decoding as a transformers ``custom_generate`` repository.

``model.generate(**inputs, custom_generate="<this repository or folder>", trust_remote_code=True,
method="dtr", max_new_tokens=128)`` makes transformers load this file and call
:func:`generate` with ``model=`` and every argument of that ``generate`` call but
``custom_generate`` and ``trust_remote_code``. This wrapper only routes them:

* verispec's own options are popped: ``method`` (``verispec.speculative``'s first argument:
  a spec string such as ``"dtr"``, ``"tr:template=16"``, ``"pld"``; a drafter object; or
  ``None``/``"ar"``; default ``"dtr"``) and every keyword of ``verispec.speculative``
  (``tokenizer``, needed for ``stop_strings``; ``draft_model``, ``runtime``, ``dtype``,
  ``kernels``, ``learn_across_calls``, and whatever the installed verispec adds). They
  build one ``verispec.speculative(...)`` callable per set of options, kept in this module,
  so later calls reuse the wrapped model and what the drafter learnt;
* the options transformers used to fetch this file (``revision``, ``token``, ``cache_dir``...)
  are dropped: they are handed on to this function too, and ``generate`` would refuse them;
* everything else goes to the model class's own ``generate`` with
  ``custom_generate=<that callable>``: transformers prepares the inputs, the generation config,
  the logits processors and the stopping criteria as usual, then verispec decodes. Whatever
  verispec cannot honour exactly raises ``verispec.errors.ConfigError`` naming the option.

All the decoding is verispec's (``pip install verispec``); this file holds no decoding code.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections import OrderedDict
from typing import Any

import torch

import verispec

__all__ = ["generate"]

# verispec's options and their defaults: `method`, then verispec.speculative's keywords
_OPTIONS: dict[str, Any] = {"method": "dtr"} | {
    name: parameter.default
    for name, parameter in inspect.signature(verispec.speculative).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
}
# what transformers' load_custom_generate reads, then also passes on to this function
_LOADER_OPTIONS = (
    "revision",
    "token",
    "cache_dir",
    "force_download",
    "proxies",
    "local_files_only",
    "repo_type",
)
_PLAIN = (str, bool, int, float, type(None), torch.dtype)
_KEEP = 8  # callables kept (least recently used dropped first)

_callables: OrderedDict[tuple, tuple[tuple, Any]] = OrderedDict()
_lock = threading.Lock()


def generate(*args: Any, **kwargs: Any) -> Any:
    """Decode with ``verispec.speculative(method, ...)`` inside transformers' ``generate``.

    transformers calls ``generate(model=model, inputs=..., generation_config=..., ...,
    **kwargs)``; a model repository holding this folder makes ``model.generate(ids, ...)``
    call ``generate(ids, ..., model=model)``; ``generate(model, ids, ...)`` works too.

    Returns:
        what ``model.generate`` returns: the sequences (int64, Shape: (1, S)), or with
        ``return_dict_in_generate=True`` a ``SpeculativeGenerateOutput`` (``sequences``,
        ``mean_accepted_tokens``, ``num_steps``, ``tree_sizes``, ``accepted_lengths``).

    Raises:
        verispec.errors.ConfigError: a bad verispec option, or a ``generate`` option verispec
            cannot honour exactly (beams, several sequences, padding, an assistant model,
            score outputs, processors or stopping criteria it cannot apply exactly...),
            named in the message.
    """
    if "model" in kwargs:
        model = kwargs.pop("model")
    elif args:
        model, args = args[0], args[1:]
    else:
        raise TypeError("generate() needs the model: generate(model, input_ids, ...)")
    options = {name: kwargs.pop(name, default) for name, default in _OPTIONS.items()}
    for name in _LOADER_OPTIONS:
        kwargs.pop(name, None)
    kwargs.pop("custom_generate", None)
    fast = _speculative(options)
    # the class's generate: a model repository holding this folder replaces the instance's
    return type(model).generate(model, *args, custom_generate=fast, **kwargs)


def _speculative(options: dict[str, Any]) -> Any:
    """The ``verispec.speculative`` callable for ``options``, built on the first use.

    Plain values are keyed by type and value, a dict or list (a JSON schema) by its JSON,
    other objects (a drafter, a draft model, a tokenizer) by identity; the entry holds the
    objects, so an identity is not reused while it is kept."""
    key = tuple((name, type(value).__name__, _key(value)) for name, value in options.items())
    with _lock:
        entry = _callables.get(key)
        if entry is not None:
            _callables.move_to_end(key)
            return entry[1]
    keywords = {name: value for name, value in options.items() if name != "method"}
    fast = verispec.speculative(options["method"], **keywords)
    with _lock:
        entry = _callables.setdefault(key, (tuple(options.values()), fast))
        _callables.move_to_end(key)
        while len(_callables) > _KEEP:
            _callables.popitem(last=False)
    return entry[1]


def _key(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, dict | list):
        try:
            return json.dumps(value, sort_keys=True)
        except (TypeError, ValueError):
            pass
    return id(value)
