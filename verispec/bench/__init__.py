"""The benchmark of record: ``verispec bench`` as a library.

Typical use::

    from verispec.bench import (
        METHODS, BenchConfig, make_context, run_bench, shipped_questions, select_questions,
        summarise, render_table,
    )
    from verispec.specs import parse_methods
    model, tokenizer = verispec.load_default_model()
    run = run_bench(
        make_context(model, tokenizer),
        parse_methods("ar,hf,tr:template=16", METHODS),
        select_questions(shipped_questions(), limit=1),
        BenchConfig(max_new_tokens=64),
    )
    print(render_table(summarise(run)))
"""

from verispec.bench.loop import run_bench
from verispec.bench.methods import METHODS, build_runners, check_available
from verispec.bench.prompts import (
    Question,
    build_prompt_ids,
    load_questions,
    parse_questions,
    select_questions,
    shipped_questions,
)
from verispec.bench.report import (
    BenchReport,
    Figures,
    load_report,
    merge_reports,
    render_category_table,
    render_markdown,
    render_table,
    report_from_json,
    summarise,
    to_json,
)
from verispec.bench.runner import (
    BenchConfig,
    BenchContext,
    BenchRun,
    EngineRunner,
    HFRunner,
    LlamaCppRunner,
    MethodRunner,
    TurnRecord,
    TurnResult,
    make_context,
)

__all__ = [
    "METHODS", "BenchConfig", "BenchContext", "BenchReport", "BenchRun", "EngineRunner", "Figures",
    "HFRunner", "LlamaCppRunner", "MethodRunner", "Question", "TurnRecord", "TurnResult",
    "build_prompt_ids", "build_runners", "check_available", "load_questions", "load_report",
    "make_context", "merge_reports", "parse_questions", "render_category_table",
    "render_markdown", "render_table", "report_from_json", "run_bench", "select_questions",
    "shipped_questions", "summarise", "to_json",
]  # fmt: skip
