"""``docs/experiments.md``, generated from the experiment modules (a test keeps the file in step)."""

from __future__ import annotations

import yaml

from .experiments import registry


def experiments_markdown(experiments=None) -> str:
    experiments = experiments if experiments is not None else registry()
    lines = [
        "# Experiments",
        "",
        "Generated from `src/attnflow/experiments/` by `attnflow docs --output docs` (which writes",
        "this page and config.md); a test fails when this file and the modules disagree. The model and",
        "every closed form are in [model.md](model.md); the config keys in [config.md](config.md), and",
        "how a config's blocks combine in [config/README.md](../config/README.md).",
        "",
        "What each experiment needs of its config (figure axes, pinned fields, fields that must stay",
        "fixed, bounds, input files) is declared in its module and checked, with the rest of the",
        "config, by `attnflow.config.validate` before any job runs; see",
        "[Adding an experiment](#adding-an-experiment).",
        "",
    ]
    for exp in experiments:
        axes = ", ".join(
            f"`{a.name}`" + (f" (>= {a.min_values} values)" if a.min_values > 1 else "")
            + (f" (with {', '.join(map(str, a.required))})" if a.required else "")
            for a in exp.axes
        )
        lines += [
            f"## `{exp.name}` ({exp.theorem})",
            "",
            f"**Question.** {exp.question}",
            "",
            f"**Figure axes.** {axes}; an axis missing from the grid is taken from `fixed`. "
            f"**Observable groups recorded:** {', '.join(exp.observables) or 'cosines only'}.",
            "",
            *([("**Pinned** (must stay fixed at these values): "
                + "; ".join(f"`{key}: {value}` ({why})" for key, (value, why) in exp.pinned.items()) + "."),
               ""] if exp.pinned else []),
            *([("**Fixed only** (one value, never a grid axis): "
                + "; ".join(f"`{key}` ({why})" for key, why in exp.fixed_only.items()) + "."),
               ""] if exp.fixed_only else []),
            *([("**Bounds** (every value, at each grid point): "
                + "; ".join(f"`{b.key}` in {b.describe()}" for b in exp.bounds) + "."),
               ""] if exp.bounds else []),
            *([("**Input files** (must exist): " + ", ".join(f"`{key}`" for key in exp.inputs) + "."),
               ""] if exp.inputs else []),
            f"**The figure{'s' if len(exp.figures) > 1 else ''}** ("
            + ", ".join(f"`figures/{exp.name}{'-' + part if part else ''}.png`" for part in exp.figures)
            + f", drawn `figure_width` wide). {exp.caption}",
            "",
            f"**How to read it.** {exp.reading}",
            "",
            ("**Default block** (its `fixed` fills each key that the config's block and `defaults` "
             "leave out; a block's own `grid` or `batch_over` replaces this one whole):"),
            "",
            "```yaml",
            yaml.safe_dump({exp.name: exp.defaults}, sort_keys=False, width=100).rstrip(),
            "```",
            "",
        ]
    return "\n".join(lines + ADDING)


ADDING = [
    "## Adding an experiment",
    "",
    "Write a module defining `EXPERIMENT`, an instance of a subclass of",
    "`attnflow.experiments.Experiment`, and list it under `experiment_modules` (or add it to",
    "`src/attnflow/experiments/`); `tests/toy_experiment.py` is a complete example. What the",
    "figure needs of the config is declared as class attributes, never checked by the module:",
    "",
    "| attribute | declares | refused (one `ConfigError` line) when |",
    "|---|---|---|",
    "| `axes` | `Axis(name, min_values, required, why, allowed)`: the fields the figure is drawn over | "
    "a field has fewer values, lacks a required one, or has one outside `allowed` |",
    "| `pinned` | field -> (value, why): the closed form's fixed values | "
    "the field is on the grid or has another value |",
    "| `fixed_only` | field -> why: any one value, never a grid axis | the field is on the grid |",
    "| `bounds` | `Bound(key, low, high, low_text, high_text)`: an open range, ends numbers or "
    "functions of the grid point's `Cell` | a value lies outside it at some grid point |",
    "| `inputs` | field -> function of a value returning why it names no file, or None | "
    "a value names no file |",
    "| `averages_other_axes` | whether the figure averages over grid axes outside `axes` (and says "
    "so) | False: any grid axis outside `axes` is refused (the figure has no panel for it) |",
    "",
    "Every figure not drawn over `mask` is refused a causal mask (the closed forms are for",
    "unmasked attention). `attnflow.config` (`check_needs`, `check_inputs`) evaluates the",
    "declarations and is the only module that raises `ConfigError` for a config's content;",
    "`unavailable(spec)` is separate: it returns why the experiment cannot run on this machine",
    "(say, optional weights not installed), and the sweep skips it with that reason.",
    "",
    "The data methods: `reduce(ds)` receives cells of one shape stacked along `cell` (a batch's",
    "store holds them so, `attnflow.pack`) and returns its few quantities per cell along `cell`;",
    "reduce over named dimensions only, and read a cell's parameters with",
    "`attnflow.pack.cell_values(ds, \"cell_beta\")`, not from `ds.attrs`",
    "(`tests/test_pack.py` checks every experiment's `reduce` of many cells against each cell",
    "alone). `derive(summary, spec)` adds what needs the whole grid: thresholds, fits, closed",
    "forms. `plot(summary, spec)` draws the figure; import matplotlib there, not at module top.",
    "Every summary variable has units, a long name and a description (docs/model.md, \"Units and",
    "metadata\"): those of the shipped experiments are in `attnflow.metadata`; a module declares",
    "its own in `metadata`, name -> (units, long_name, description), and the aggregation stops,",
    "naming any summary variable declared nowhere.",
    "",
]


def _value(v) -> str:
    return f"`{list(v) if isinstance(v, tuple) else v}`"


def _cell(text: str) -> str:
    """Text for a markdown table cell (a bare | would end the cell)."""
    return text.replace("|", "\\|")


def config_markdown() -> str:
    """``docs/config.md``: every cell field with its default, choices and meaning, from ``Cell``."""
    from .attention import ATTENTIONS
    from .cell import _DEFAULTS, CONDITIONAL_FIELDS, FIELD_CHOICES, FIELD_DOCS
    from .config import TOP_LEVEL
    from .geometry import GEOMETRIES
    from .heads import HEADS, VALUES
    from .observables import GROUPS
    from .strengths import STRENGTHS
    from .tokens import INITS

    lines = [
        "# Config reference",
        "",
        "Generated from `attnflow.Cell` and the declarations by `attnflow docs --output docs`; a test",
        "fails when this file and the code disagree. How the keys combine:",
        "[config/README.md](../config/README.md).",
        "",
        "Every check of a config's content lives in `attnflow.config` (`load`, `validate`): the YAML,",
        "the schema below, `results` and the scheduler, each experiment block (extra points,",
        "`batch_over`, grid values, the cells, which `Cell` itself refuses with the field named) and",
        "what each experiment declares it needs ([experiments.md](experiments.md#adding-an-experiment)).",
        "Each refusal is one `ConfigError` line naming the key and value.",
        "",
        "## Top level",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    for key, (default, doc) in TOP_LEVEL.items():
        lines.append(f"| `{key}` | {'' if default is None else _value(default)} | {_cell(doc)} |")
    lines += ["", "## Cell fields (`defaults`, `fixed`, `grid`)", "",
              "Fields marked * are read only under some choices (see the tables below); elsewhere they",
              "are reset to their default, so equal simulations share one store. An experiment's `fixed`",
              "or `grid` that sets one away from its default where none of its cells reads it is refused.",
              "`observables` and `engine` are no grid axes.", "",
              "| field | default | meaning |", "|---|---|---|"]
    for name, doc in FIELD_DOCS.items():
        choices = f" (one of {', '.join(FIELD_CHOICES[name])})" if name in FIELD_CHOICES else ""
        star = "*" if name in CONDITIONAL_FIELDS else ""
        lines.append(f"| `{name}`{star} | {_value(_DEFAULTS[name])} | {_cell(doc + choices)} |")
    for title, registry_, describe in (
        ("Attention types (`attention`)", ATTENTIONS,
         lambda a: f"weights {a.formula}; velocity {a.velocity}; {a.description}"),
        ("Head structures (`heads`)", HEADS, lambda h: h.description + (f"; reads {', '.join(h.uses)}"
                                                                           if h.uses else "")),
        ("Head strengths (`lambda_dist`)", STRENGTHS, lambda s: s.description + (
            f"; reads {', '.join(s.uses)}" if s.uses else "")),
        ("Initial tokens (`init`)", INITS, lambda i: i.description + (f"; reads {', '.join(i.uses)}"
                                                                        if i.uses else "")),
        ("Geometries (`geometry`)", GEOMETRIES, lambda g: g.description + (
            f"; speed s_k = {g.speed_text}" if g.speed_text else "") + (f"; reads {', '.join(g.uses)}"
                                                                          if g.uses else "")),
        ("Value matrices (`values`)", VALUES, lambda v: v.description),
        ("Observable groups (`observables`)", GROUPS, lambda g: g.description + ": " + ", ".join(
            f"`{v.name}`" for v in g.variables)),
    ):
        lines += ["", f"## {title}", "", "| name | meaning |", "|---|---|"]
        lines += [f"| `{item.name}` | {_cell(describe(item))} |" for item in registry_]
    return "\n".join(lines) + "\n"
