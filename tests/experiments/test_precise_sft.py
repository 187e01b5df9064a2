"""experiments.precise_sft end to end on a tiny random model (the injected loader returns a tiny one):
lr search, resume inside the grid, folders of the earlier argparse code."""

import json

import pytest

from circuits.errors import InputError
from experiments.runtime.run_folder import OutputExistsError


pytestmark = pytest.mark.usefixtures("one_thread")


def test_precise_sft_experiment_writes_results(run_main, tiny_loader, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--out", str(out), "--k", "2", "--n-train", "16", "--steps", "2", "--batch-size", "8",
              "--micro-batch-size", "8", "--n-heldout", "2", "--n-transfer", "1", "--n-val", "2", "--n-shots", "0",
              "--n-pydoc", "1", "--n-sentences", "3", "--n-rank-prompts", "4", "--precise-lrs", "1e-2,1e-3",
              "--full-lrs", "1e-3", "--lora-lrs", "2e-4,1e-3"]
    # two commands into one folder: the precise arms (with the Table-2 ablation), then the rest with --resume
    run_main("experiments.precise_sft", [*common, "--methods", "precise,precise_nokv", "--ablation-k", "1,2",
                                         "--ablation-mlps", "1"], tiny_loader)
    partial = json.loads((out / "results.json").read_text())
    assert partial["status"] == "running" and "claims" not in partial
    run_main("experiments.precise_sft", [*common, "--methods", "full,lora", "--resume"], tiny_loader)
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and len(results["wall_seconds_by_command"]) == 2
    assert set(results["runs"]) == {"precise", "precise_nokv", "full", "lora", "ablation_k1", "ablation_k1_mlp1",
                                    "ablation_k2", "ablation_k2_mlp1"}
    for method, grid in (("precise", [1e-3, 1e-2]), ("precise_nokv", [1e-3, 1e-2]), ("full", [1e-3]),
                         ("lora", [2e-4, 1e-3])):
        search = results["lr_search"][method]
        assert search["grid"] == grid and set(search["by_lr"]) == {f"{lr:g}" for lr in grid}
        best = max(v["validation_exact"]["value"] for v in search["by_lr"].values())
        chosen = search["by_lr"][f"{search['chosen_lr']:g}"]["validation_exact"]
        assert chosen["value"] == best and chosen["n"] == 8  # 2 validation prompts x 4 operations
        assert results["runs"][method]["lr"] == search["chosen_lr"]
    runs = results["runs"]
    assert runs["precise_nokv"]["train"]["n_trainable"] < runs["precise"]["train"]["n_trainable"] \
        < runs["full"]["train"]["n_trainable"]
    assert runs["ablation_k2"]["lr"] == results["lr_search"]["precise"]["chosen_lr"]
    summary = runs["precise"]["summary"]
    assert summary["heldout_exact"]["n"] == 8 and summary["heldout_exact"]["interval"] == "wilson"
    assert summary["heldout_gain"]["low"] <= summary["heldout_gain"]["value"] <= summary["heldout_gain"]["high"]
    assert set(results["claims"]) == {"precise", "precise_nokv"}
    assert results["claims"]["precise"]["verdict"] in ("reproduced", "not reproduced")
    assert (out / "report.html").is_file()
    # a resumed folder refuses other settings
    from experiments.precise_sft import main as precise_main

    with pytest.raises(InputError, match=r"--resume: .* was run with other settings \(steps\)"):
        precise_main([*common, "--methods", "full", "--resume", "--steps", "3"])
    # the command line turns the OutputExistsError into one line on stderr and exit status 2
    with pytest.raises(SystemExit) as exit_info:
        run_main("experiments.precise_sft", [*common, "--methods", "full"], tiny_loader)
    assert exit_info.value.code == 2
    assert isinstance(exit_info.value.__context__, OutputExistsError)
    assert "already holds a run" in capsys.readouterr().err


def test_precise_sft_resumes_inside_the_lr_grid(tiny_loader, monkeypatch, tmp_path):
    """A command stopped after one lr trial resumes at the next and ends as an uninterrupted run does."""
    import experiments.precise_sft as exp

    common = ["--heads", "L1H0,L1H2", "--k", "2", "--n-train", "16", "--steps", "2", "--batch-size", "8",
              "--micro-batch-size", "8", "--n-heldout", "2", "--n-transfer", "1", "--n-val", "3", "--n-shots", "0",
              "--n-pydoc", "1", "--n-sentences", "2", "--methods", "full,precise_nokv",
              "--full-lrs", "1e-3,3e-2,1e-1", "--precise-lrs", "1e-2"]
    exp.main([*common, "--out", str(tmp_path / "whole")], loader=tiny_loader)
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())

    import finetune  # the experiment imports finetune.train when a trial starts

    real_train, calls = finetune.train, []

    def stop_at_the_third_trial(*args, **kwargs):
        calls.append(kwargs["method"])
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a time limit would
        return real_train(*args, **kwargs)

    monkeypatch.setattr(finetune, "train", stop_at_the_third_trial)
    with pytest.raises(KeyboardInterrupt):
        exp.main([*common, "--out", str(tmp_path / "cut")], loader=tiny_loader)
    cut = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert set(cut["lr_search"]["full"]["by_lr"]) == {"0.001", "0.03"} and not cut["runs"]
    monkeypatch.setattr(finetune, "train", real_train)
    exp.main([*common, "--out", str(tmp_path / "cut"), "--resume"], loader=tiny_loader)
    resumed = json.loads((tmp_path / "cut" / "results.json").read_text())
    for method in ("full", "precise_nokv"):
        assert resumed["lr_search"][method]["chosen_lr"] == whole["lr_search"][method]["chosen_lr"]
        assert resumed["runs"][method]["math"] == whole["runs"][method]["math"]  # same tuned weights
        assert resumed["runs"][method]["drift"]["kl"] == pytest.approx(whole["runs"][method]["drift"]["kl"])
    kept = [k for k, v in resumed["lr_search"]["full"]["by_lr"].items() if v["kept"]]
    assert kept == [f"{resumed['lr_search']['full']['chosen_lr']:g}"]
    assert sorted(p.name for p in (tmp_path / "cut" / "runs").iterdir()) == sorted(
        f"{m}_lr{resumed['lr_search'][m]['chosen_lr']:g}" for m in ("full", "precise_nokv"))


# results.json "args" as the module-level argparse of the earlier precise_sft wrote it (vars(args), "debug"
# included, lr grids as lists), for the flags of the test below: folders of that code must stay resumable.
EARLIER_ARGS = {
    "debug": False, "model": "gemma-3-270m", "methods": ["full"], "heads": "L1H0,L1H2", "mlps": None, "k": 2,
    "ablation_k": "", "ablation_mlps": 0, "n_train": 16, "steps": 2, "batch_size": 8, "micro_batch_size": 8,
    "precise_lrs": [0.01], "full_lrs": [0.001], "lora_lrs": [0.0001, 0.0003, 0.001], "lora_rank": 8, "n_val": 3,
    "n_heldout": 2, "n_transfer": 1, "n_shots": 0, "n_pydoc": 1, "n_sentences": 2, "drift_tokens": 96,
    "n_rank_prompts": 24, "seed": 0, "threads": 0, "device": "auto", "out": "X", "overwrite": False, "resume": False,
}


def test_precise_sft_resumes_a_folder_of_the_earlier_argparse_code(tiny_loader, tmp_path):
    import experiments.precise_sft as exp

    out = tmp_path / "run"
    common = ["--heads", "L1H0,L1H2", "--k", "2", "--n-train", "16", "--steps", "2", "--batch-size", "8",
              "--micro-batch-size", "8", "--n-heldout", "2", "--n-transfer", "1", "--n-val", "3", "--n-shots", "0",
              "--n-pydoc", "1", "--n-sentences", "2", "--full-lrs", "1e-3", "--precise-lrs", "1e-2", "--out", str(out)]
    exp.main([*common, "--methods", "full"], loader=tiny_loader)
    results = json.loads((out / "results.json").read_text())
    # the new config records the same settings under the same keys as the earlier code (less "debug")
    assert results["args"] == {k: v for k, v in {**EARLIER_ARGS, "out": str(out)}.items() if k != "debug"}
    results["args"] = {**EARLIER_ARGS, "out": str(out)}
    (out / "results.json").write_text(json.dumps(results))
    with pytest.raises(InputError, match=r"other settings \(full_lrs\)"):
        exp.main([*common, "--full-lrs", "1e-3,1e-2", "--methods", "precise_nokv", "--resume"],  # last flag wins
                 loader=tiny_loader)
    exp.main([*common, "--methods", "precise_nokv", "--resume"], loader=tiny_loader)
    resumed = json.loads((out / "results.json").read_text())
    assert set(resumed["runs"]) == {"full", "precise_nokv"} and resumed["runs"]["full"] == results["runs"]["full"]
    assert resumed["args"] == results["args"] and len(resumed["wall_seconds_by_command"]) == 2


def test_precise_sft_on_the_edge_circuits_heads_beside_the_key_heads(run_main, tiny_loader, tmp_path):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--k", "2", "--n-train", "16", "--steps", "2", "--batch-size", "8",
            "--micro-batch-size", "8", "--n-heldout", "2", "--n-transfer", "1", "--n-val", "2", "--n-shots", "0",
            "--n-pydoc", "1", "--n-sentences", "3", "--n-rank-prompts", "4", "--precise-lrs", "1e-3", "--full-lrs",
            "1e-3", "--methods", "precise,precise_circuit,full", "--circuit-size", "0.2", "--shift-prompts", "4"]
    run_main("experiments.precise_sft", argv, tiny_loader)
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert runs["precise_circuit"]["heads"] == results["circuit_heads"] and len(results["circuit_heads"]) == 2
    assert runs["precise"]["heads"] == results["key_heads"]
    choice = results["head_choice"]
    assert choice["k"] == 2 and choice["gain_difference"]["low"] <= choice["gain_difference"]["value"] \
        <= choice["gain_difference"]["high"]
    for method in ("precise", "precise_circuit", "full"):  # full SFT keeps gemma's absent b_O at zero: a graph still
        shift = runs[method]["circuit_shift"]
        assert shift["n_prompts"] <= 4 and -1 <= shift["spearman"]["value"] <= 1
        assert len(shift["transferred_table"]) == shift["n_prompts"]
    # paired preservation from the per-prompt tables: its point value is the difference of the two curves' CPRs
    preservation = results["circuit_preservation"]
    assert set(preservation) == {"precise minus full", "precise_circuit minus precise", "precise_circuit minus full"}
    for pair, d in preservation.items():
        a, b = pair.split(" minus ")
        expected = runs[a]["circuit_shift"]["transferred_cpr"]["value"] - runs[b]["circuit_shift"]["transferred_cpr"]["value"]
        assert d["cpr_difference"]["value"] == pytest.approx(expected, rel=1e-6, abs=1e-9)
        assert d["cpr_difference"]["low"] <= d["cpr_difference"]["value"] <= d["cpr_difference"]["high"]
    assert "Does tuning keep the base model" in (out / "report.html").read_text()
    assert results["status"] == "running"  # lora and precise_nokv not run yet: resumable


def test_precise_sft_with_circuit_lora_as_a_fourth_arm(run_main, tiny_loader, tmp_path):
    out = tmp_path / "run"
    argv = ["--out", str(out), "--k", "2", "--n-train", "16", "--steps", "2", "--batch-size", "8",
            "--micro-batch-size", "8", "--n-heldout", "2", "--n-transfer", "1", "--n-val", "2", "--n-shots", "0",
            "--n-pydoc", "1", "--n-sentences", "3", "--n-rank-prompts", "4", "--precise-lrs", "1e-3", "--full-lrs",
            "1e-3", "--lora-lrs", "1e-3", "--circuit-lora-lrs", "1e-3,1e-2", "--lora-rank", "2",
            "--methods", "precise,full,lora,circuit_lora", "--shift-prompts", "4"]
    run_main("experiments.precise_sft", argv, tiny_loader)
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert set(runs) == {"precise", "full", "lora", "circuit_lora"}
    arm = runs["circuit_lora"]
    assert arm["method"] == "circuit_lora" and arm["heads"] == results["key_heads"] == runs["precise"]["heads"]
    search = results["lr_search"]["circuit_lora"]
    assert search["grid"] == [1e-3, 1e-2] and arm["lr"] == search["chosen_lr"]
    # rank-2 adapters on two heads: fewer entries than LoRA everywhere and than the heads' full slices
    assert arm["train"]["n_trainable"] < runs["lora"]["train"]["n_trainable"]
    assert arm["train"]["n_trainable"] < runs["precise"]["train"]["n_trainable"]
    gain = arm["summary"]["heldout_gain"]
    assert gain["low"] <= gain["value"] <= gain["high"] and "kl" in arm["summary"]["drift_estimates"]
    assert "circuit_lora" in results["claims"] and "precise" in results["claims"]
    comparison = results["circuit_lora_comparison"]
    assert set(comparison) == {"circuit_lora minus lora", "circuit_lora minus precise", "circuit_lora minus full"}
    d = comparison["circuit_lora minus lora"]
    assert d["gain_difference"]["low"] <= d["gain_difference"]["value"] <= d["gain_difference"]["high"]
    assert d["trained_ratio"] == arm["train"]["n_trainable"] / runs["lora"]["train"]["n_trainable"]
    assert "transferred_cpr" in arm["circuit_shift"]
    assert {"circuit_lora minus lora", "circuit_lora minus precise", "circuit_lora minus full",
            "precise minus full", "precise minus lora"} <= set(results["circuit_preservation"])
    assert "circuit_lora_lrs" in results["args"]  # a non-default grid is recorded
    assert "Circuit LoRA: adapters on the key heads only" in (out / "report.html").read_text()
    assert results["status"] == "running"  # precise_nokv, a default arm, not run yet


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the two-process launch is a CPU (gloo) check")
def test_two_processes_write_one_run_folder(tmp_path):
    """`accelerate launch -m experiments.precise_sft` (docs/gpu.md): every process trains, the first alone writes
    the folder, and the run ends complete with the single-process run's choices."""
    from pathlib import Path

    from tests.experiments import precise_sft_launch_script as script
    from tests.launch import launch_two_processes

    launch_two_processes(Path(script.__file__), str(tmp_path / "launched"), port=29735, timeout=300)
    launched = json.loads((tmp_path / "launched" / "results.json").read_text())
    assert launched["status"] == "complete" and (tmp_path / "launched" / "report.html").is_file()

    script.main([*script.ARGV, "--out", str(tmp_path / "single")], loader=script.loader)
    single = json.loads((tmp_path / "single" / "results.json").read_text())
    assert set(launched["runs"]) == set(single["runs"])
    for method, search in single["lr_search"].items():
        assert launched["lr_search"][method]["chosen_lr"] == search["chosen_lr"], method
        kept = [lr for lr, entry in search["by_lr"].items() if entry["kept"]]
        # the discarded trials' weights are gone, the kept one's remain, exactly as in one process
        assert sorted(p.name for p in (tmp_path / "launched" / "runs").iterdir() if p.name.startswith(f"{method}_lr")) \
            == [f"{method}_lr{lr}" for lr in sorted(kept)]
    for method, entry in single["runs"].items():
        # the same update up to the order in which the processes' gradients are summed
        assert launched["runs"][method]["losses"] == pytest.approx(entry["losses"], rel=1e-4), method


def test_circuit_lora_without_kv_rows_leaves_them_frozen(tiny_loader, tmp_path):
    """circuit_lora_nokv: the same adapters as circuit_lora on the same heads, none on the K/V rows."""
    from safetensors import safe_open

    from experiments.precise_sft import main as precise_main

    out = tmp_path / "run"
    results = precise_main(["--out", str(out), "--heads", "L1H0,L1H2", "--k", "2", "--n-train", "16", "--steps", "2",
                            "--batch-size", "8", "--micro-batch-size", "8", "--n-heldout", "2", "--n-transfer", "1",
                            "--n-val", "2", "--n-shots", "0", "--n-pydoc", "1", "--n-sentences", "2",
                            "--methods", "circuit_lora,circuit_lora_nokv", "--circuit-lora-lrs", "1e-2"],
                           loader=tiny_loader)
    runs = results["runs"]
    assert runs["circuit_lora"]["tune_kv"] is True and runs["circuit_lora_nokv"]["tune_kv"] is False
    assert runs["circuit_lora_nokv"]["heads"] == runs["circuit_lora"]["heads"] == ["L1H0", "L1H2"]
    assert runs["circuit_lora_nokv"]["train"]["n_trainable"] < runs["circuit_lora"]["train"]["n_trainable"]
    stored = {}
    for arm in ("circuit_lora", "circuit_lora_nokv"):
        (final,) = (out / "runs").glob(f"{arm}_lr*/final")
        with safe_open(str(next(final.glob("*.safetensors"))), "pt") as f:
            stored[arm] = set(f.keys())
    assert any("W_K" in k for k in stored["circuit_lora"]) and any("W_V" in k for k in stored["circuit_lora"])
    assert not any("W_K" in k or "W_V" in k for k in stored["circuit_lora_nokv"])
    assert any("W_Q" in k for k in stored["circuit_lora_nokv"])
    pair = results["circuit_lora_comparison"]["circuit_lora_nokv minus circuit_lora"]
    assert pair["kl_difference"]["low"] <= pair["kl_difference"]["value"] <= pair["kl_difference"]["high"]
