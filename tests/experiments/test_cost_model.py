"""experiments.cost_model: its FLOP formulas count what torch's FlopCounterMode counts when the sweeps run.

FlopCounterMode counts the matrix multiplications (forward and backward) of whatever runs
inside it; the formulas are written from the algorithms, so agreement checks both the
formulas and the sweeps' claimed shortcuts (prefix reuse, END-only rows, starting at the
patched layer). Tiny random models, a few seconds each.
"""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from circuits.graph import GraphLayout
from circuits.nodes import Head
from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model
from circuits.errors import InputError
from experiments.cost_model import SWEEPS, MeasureConfig, batch_prefix, main, patched_counts, shape_of
from experiments.runtime import cli
from patching import activation_patch, path_patch
from patching.edges import edge_attribution, edge_patch, faithfulness_curve
from patching.node_level.knockout_curves import knockout_correct
from patching.sweeps.forward import shared_prefix_length
from patching.edges.engine import edge_mode
from patching import SweepOptions


def _counted(run) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


@pytest.mark.parametrize("style", ["gpt2", "gemma"])
def test_formulas_count_the_flops_the_sweeps_run(style):
    model = tiny_model(style=style, n_layers=3)
    data = make_dataset(model, n_prompts=6, n_shots=1, template_ids=["add-equation-0"], seed=2)
    tokens, cf = torch.tensor(data["tokens"]), torch.tensor(data["cf_tokens"])
    T = tokens.shape[1]
    shape = replace(shape_of(model), T=T, S=T - shared_prefix_length(tokens, cf), B=len(data), P=batch_prefix(tokens))
    assert 0 < shape.S < T and 0 < shape.P < T  # the prompts share a prefix: the formulas' T, S and P differ
    layout = GraphLayout.of(model)
    edges = layout.real_edge_mask.nonzero().tolist()
    scores = torch.randn(layout.n_forward, layout.n_backward, generator=torch.Generator().manual_seed(0))

    # one block per position: exact
    with torch.no_grad():
        assert _counted(lambda: model(tokens, stop_at_layer=shape.L)) == SWEEPS["forward"].flops(shape, {})
        with edge_mode(model):
            assert _counted(lambda: model(tokens, stop_at_layer=shape.L)) == shape.B * T * shape.L * shape.f_edge

    sweeps = {
        "path_patch": (lambda: path_patch(model, data, options=SweepOptions(progress=False)), {}),
        "activation_patch": (lambda: activation_patch(model, data, options=SweepOptions(progress=False)), {}),
        "knockout": (lambda: knockout_correct(model, data, [[Head(0, 1), Head(2, 3)], [Head(1, 0)]], n_pool=16),
                     {"pool": 16, "sets": 2}),
        "edge_attribution": (lambda: edge_attribution(model, data, ig_steps=5,
                                                      options=SweepOptions(progress=False)), {"steps": 5}),
        "edge_patch": (lambda: edge_patch(model, edges, data, options=SweepOptions(progress=False)),
                       patched_counts(layout, edges)),
        "faithfulness_curve": (lambda: faithfulness_curve(model, scores, data, n_bootstrap=10,
                                                          options=SweepOptions(progress=False)),
                               {"circuits": 12}),
    }
    for name, (run, extra) in sweeps.items():
        ratio = _counted(run) / SWEEPS[name].flops(shape, extra)
        assert 0.9 < ratio < 1.1, f"{name}: counted / formula = {ratio:.3f}"


def test_measure_and_fit_write_their_json(tmp_path):
    for style in ("gpt2", "llama"):
        main(["measure", "--model", f"tiny-{style}", "--n-prompts", "4", "--edge-stride", "7", "--only", "forward",
              "edge_patch", "--out", str(tmp_path / style)])
    main(["fit", str(tmp_path / "gpt2"), str(tmp_path / "llama" / "results.json"), "--out", str(tmp_path / "fit")])
    fit = json.loads((tmp_path / "fit" / "results.json").read_text())
    assert fit["alphas"]["forward"] == pytest.approx(1.0)  # R is defined by the plain forward
    rows = {(r["model"], r["sweep"]): r for r in fit["table"]}
    assert rows[("tiny-gpt2", "forward")]["predicted_s"] == pytest.approx(rows[("tiny-gpt2", "forward")]["measured_s"])
    llama = {p["sweep"]: p for p in fit["predictions"] if p["model"] == "Llama-2-7B"}
    assert llama["edge_patch"]["edges"] == 1_592_881 and llama["forward"]["weights_gb"] == pytest.approx(13.5, abs=0.3)
    measured = json.loads((tmp_path / "gpt2" / "results.json").read_text())
    assert measured["status"] == "complete" and fit["status"] == "complete"
    assert set(measured["measured"]) == {"forward", "edge_patch"} and measured["model"] == "tiny-gpt2"


def _cli(argv, capsys) -> str:
    """``python -m experiments.cost_model`` with ``argv``: it must fail with exit status 2; its stderr."""
    with pytest.raises(SystemExit) as exit_info:
        cli.run_cli(main, "cost_model", argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_fit_refuses_an_out_that_is_a_file_and_leaves_it_untouched(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("a week of notes")
    err = _cli(["fit", "--out", str(notes)], capsys)
    assert "exists and is not a folder" in err and "Traceback" not in err
    assert notes.read_text() == "a week of notes" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_measure_only_with_an_unknown_sweep_fails_before_any_work(tmp_path, capsys):
    err = _cli(["measure", "--model", "tiny-gpt2", "--only", "forwrd", "--out", str(tmp_path / "run")], capsys)
    assert "--only: invalid choice: 'forwrd'" in err and "edge_patch" in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(InputError, match="forwrd"):  # a config built in code is checked too
        MeasureConfig(only=("forward", "forwrd"))


@pytest.mark.parametrize("content, message", [(None, "no such file"), ("{not json", "is not JSON"),
                                              ('{"model": "m"}', "is not a cost_model measurement"),
                                              ('{"model": "m", "shape": {}, "sweep_shapes": {}, "measured": {}}',
                                               "no measurement of the plain forward")])
def test_fit_names_a_bad_input_file_in_one_line(tmp_path, capsys, content, message):
    bad = tmp_path / "gemma.json"
    if content is not None:
        bad.write_text(content)
    err = _cli(["fit", str(bad), "--out", str(tmp_path / "fit")], capsys)
    first, hint = err.splitlines()
    assert first.startswith(f"python -m experiments.cost_model: error: {bad}: ") and message in first
    assert hint.startswith("hint: ") and "Traceback" not in err
    assert not (tmp_path / "fit").exists()  # refused before the run folder is made


def test_fit_refuses_an_existing_markdown_file_before_any_work(tmp_path, capsys):
    notes = tmp_path / "notes.md"
    notes.write_text("my own notes")
    err = _cli(["fit", "--out", str(tmp_path / "fit"), "--markdown", str(notes)], capsys)
    assert f"--markdown {notes} already exists; pass --overwrite" in err and "Traceback" not in err
    assert notes.read_text() == "my own notes" and not (tmp_path / "fit").exists()
    from experiments.cost_model import FitConfig

    with pytest.raises(InputError, match="already exists; pass --overwrite"):  # a config built in code is checked too
        FitConfig(markdown=str(notes))
    FitConfig(markdown=str(notes), overwrite=True)


def test_fit_refuses_a_markdown_path_it_cannot_write_before_any_work(tmp_path, capsys):
    """A folder gave an IsADirectoryError traceback, /proc a FileNotFoundError one, both after the fit had run."""
    from experiments.cost_model import FitConfig

    folder = tmp_path / "tables"
    folder.mkdir()
    err = _cli(["fit", "--out", str(tmp_path / "fit"), "--markdown", str(folder), "--overwrite"], capsys)
    assert err.startswith(f"python -m experiments.cost_model: error: --markdown {folder} is a folder; give the path "
                          f"of a file to write the tables to (e.g. {folder / 'gpu_tables.md'}).")
    notes = tmp_path / "notes.txt"
    notes.write_text("a week of notes")
    err = _cli(["fit", "--out", str(tmp_path / "fit"), "--markdown", str(notes / "t.md")], capsys)
    assert err.startswith(f"python -m experiments.cost_model: error: --markdown {notes / 't.md'} cannot be written: "
                          f"{notes} is a file, not a folder. Choose a path in a folder you can write.")
    assert "Traceback" not in err and not (tmp_path / "fit").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "tables"]  # no probe file left behind
    if Path("/proc").is_dir():  # a folder even root cannot create files in
        with pytest.raises(InputError, match=r"^--markdown /proc/adv2\.md cannot be written: .*\(/proc\)\. Choose a "
                                             r"path in a folder you can write\.$"):
            FitConfig(markdown="/proc/adv2.md", out=str(tmp_path / "fit"))


def test_fit_refuses_a_markdown_path_the_run_itself_writes(tmp_path, capsys):
    """--markdown o/results.json --out o ended complete, the tables overwritten by results.json."""
    from experiments.cost_model import FitConfig

    out = tmp_path / "o"
    err = _cli(["fit", "--out", str(out), "--markdown", str(out / "results.json")], capsys)
    assert err.startswith(f"python -m experiments.cost_model: error: --markdown {out / 'results.json'} is results.json "
                          f"of --out {out}, which the run writes itself after the tables, so they would be "
                          f"overwritten; name another file (e.g. {out / 'gpu_tables.md'}).")
    assert "Traceback" not in err and not out.exists()
    with pytest.raises(InputError, match=r"is \.arith-circuits-run\.json of --out o, which the run writes itself"):
        FitConfig(markdown="./o/../o/.arith-circuits-run.json", out="o")  # compared once resolved
    with pytest.raises(InputError, match=r"^--markdown o is the --out folder itself; give the path of a file"):
        FitConfig(markdown="o", out=str(Path("o").absolute()))
    main(["fit", "--out", str(out), "--markdown", str(out / "sub" / "tables.md")])  # inside --out, a new name: fine
    assert (out / "sub" / "tables.md").read_text().startswith("| model | B | sweep |")
    assert json.loads((out / "results.json").read_text())["status"] == "complete"


def test_fit_lists_only_the_flags_it_uses(capsys):
    """``fit`` loads no model: no --model, --device, --dtype, --threads or --seed that would do nothing."""
    from experiments.cost_model import parse_config

    with pytest.raises(SystemExit):
        parse_config(["fit", "--help"])
    flags = set(re.findall(r"(--[a-z-]+)", capsys.readouterr().out))
    assert flags == {"--help", "--debug", "--markdown", "--out", "--overwrite"}
    with pytest.raises(SystemExit) as exit:
        parse_config(["fit", "--model", "gemma-3-270m"])
    assert exit.value.code == 2
