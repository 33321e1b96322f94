"""Experiment loading: number coercion, base: merging, unknown keys, one bad file per rule."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from bigscience_ops import resources
from bigscience_ops.config.loading import load_experiment, to_dict, from_dict
from bigscience_ops.config.derivation import exit_margin_minutes
from bigscience_ops.config.files import list_experiments
from bigscience_ops.errors import ConfigError


def write(directory: Path, name: str, text: str) -> str:
    (directory / f"{name}.yaml").write_text(textwrap.dedent(text))
    return name


def test_every_bundled_experiment_loads(repo_root: Path) -> None:
    names = list_experiments(repo_root / "trainings")
    assert {"tr1-13B", "tr1-13B-short", "tr8-104B", "megatron-7.5B", "gpt-760M", "tiny"} <= set(names)
    for name in names:
        exp = load_experiment(name, repo_root / "trainings")
        assert exp.name == name


def test_numbers_are_coerced_to_declared_types(trainings: Path) -> None:
    write(trainings, "x", """
        base: tiny
        train: {samples: 10e3}
        batch: {rampup: {start: 8, increment: 4, samples: 1_000}}
        optimizer: {lr: 6e-5, min_lr: 1e-6, eps: 1.0e-8}
    """)
    exp = load_experiment("x", trainings)
    assert exp.train.samples == 10_000 and isinstance(exp.train.samples, int)
    assert exp.batch.rampup.samples == 1000
    assert exp.optimizer.lr == pytest.approx(6e-5) and isinstance(exp.optimizer.lr, float)
    assert exp.optimizer.eps == pytest.approx(1e-8)


@pytest.mark.parametrize("value", ["10.5e6", "1.5", "ten", "true"])
def test_integer_fields_reject_non_integers(trainings: Path, value: str) -> None:
    write(trainings, "x", f"base: tiny\ntrain: {{samples: {value}}}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("x", trainings)
    assert err.value.field == "train.samples"
    assert err.value.source.endswith("x.yaml")
    assert "integer" in err.value.allowed


def test_unknown_key_lists_valid_keys(trainings: Path) -> None:
    write(trainings, "x", "base: tiny\nmodel: {hiden_size: 64}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("x", trainings)
    assert err.value.field == "model.hiden_size"
    assert "hidden_size" in err.value.allowed and "num_layers" in err.value.allowed


def test_unknown_section_is_rejected(trainings: Path) -> None:
    write(trainings, "x", "base: tiny\noptimiser: {lr: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("x", trainings)
    assert err.value.field == "optimiser" and "optimizer" in err.value.allowed


def test_base_merges_deeply_and_child_wins(trainings: Path) -> None:
    exp = load_experiment("tr8-104B", trainings)
    base = load_experiment("tr1-13B", trainings)
    assert exp.model.hidden_size == 16384 and exp.model.seq_length == base.model.seq_length == 2048
    assert exp.optimizer.beta2 == 0.95 and exp.optimizer.beta1 == base.optimizer.beta1
    assert exp.slurm.partition == base.slurm.partition == "gpu_p13"
    assert exp.checkpoint.save_schedule == [] and base.checkpoint.save_schedule
    # tr8-104B is a record of the seeds' run: its own Hub repo is shown as what that run used, never used.
    assert exp.hub.tensorboard_repo is None and exp.hub.logs_repo is None
    assert dict(exp.recorded)["hub.logs_repo"] == "bigscience/tr8-104B-logs"


def test_a_record_is_tried_under_the_current_folder_and_tells_nobody(trainings: Path, tmp_path: Path) -> None:
    """The bundled seeds are records (record: true): their run folders, alert addresses and Hub repos are set
    aside, so trying one never mails the seeds' list, pushes to their repos or writes to their scratch. An
    experiment based on a record is not a record: it takes the seeds' values as they are written."""
    exp = load_experiment("tr1-13B", trainings)
    assert exp.record and exp.paths.output == str(tmp_path / "runs" / "tr1-13B")  # the project folder's runs/
    assert exp.alerts.email_to == [] and exp.hub.logs_repo is None and exp.hub.checkpoints_repo is None
    recorded = dict(exp.recorded)
    assert recorded["paths.output"] == "/gpfsscratch/rech/six/commun/checkpoints/tr1-13B"
    assert recorded["alerts.email_to"] == ["bigscience-jean-zay@groups.google.com"]
    assert exp.slurm.account == "six@gpu"  # the cluster's values stay what the seeds used: a plan shows them
    (trainings / "mine.yaml").write_text("base: tr1-13B\n")
    mine = load_experiment("mine", trainings)
    assert not mine.record and mine.recorded == ()
    assert mine.alerts.email_to == ["bigscience-jean-zay@groups.google.com"]  # `bsops new` resets such values


def test_derived_values_follow_their_sources(trainings: Path, tmp_path: Path) -> None:
    exp = load_experiment("tr8-104B", trainings)
    # Not copied from tr1-13B's 20480: derived from this experiment's own hidden size.
    assert exp.model.ffn_hidden_size == 4 * 16384
    assert "model.ffn_hidden_size" in exp.derived
    assert exp.slurm.job_name == "tr8-104B"
    assert exp.paths.logs == str(tmp_path / "runs" / "tr8-104B" / "logs")  # a record's: its seed path set aside
    assert exp.checkpoint.exit_duration_in_mins == 20 * 60 - exit_margin_minutes(104e9)


def test_exit_margin_grows_with_model_size() -> None:
    assert exit_margin_minutes(13e9) == 10  # the tr1-13B notes' 1190 = 20h - 10 min
    assert exit_margin_minutes(1e6) == 5
    assert exit_margin_minutes(104e9) > exit_margin_minutes(13e9)


def test_time_limit_is_a_string_not_base_60(trainings: Path) -> None:
    exp = load_experiment("tr1-13B", trainings)
    assert exp.slurm.time == "20:00:00"
    assert exp.checkpoint.exit_duration_in_mins == 1190


def test_resolved_round_trip(trainings: Path) -> None:
    exp = load_experiment("tr1-13B", trainings)
    again = from_dict(to_dict(exp))
    assert to_dict(again) == to_dict(exp)


def test_base_loop_and_missing_base(trainings: Path) -> None:
    write(trainings, "a", "base: b\n")
    write(trainings, "b", "base: a\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("a", trainings)
    assert err.value.field == "base"
    write(trainings, "c", "base: nope\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("c", trainings)
    assert err.value.field == "base" and "tiny" in err.value.allowed


def test_unknown_experiment_lists_known(trainings: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_experiment("tr9", trainings)
    assert "tr1-13B" in err.value.allowed


def test_error_names_the_file_that_set_the_value(trainings: Path) -> None:
    write(trainings, "parent", "base: tiny\nmodel: {num_layers: 1}\n")
    write(trainings, "child", "base: parent\nmodel: {hidden_size: 128}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("child", trainings)
    assert err.value.field == "model.num_layers"
    assert err.value.value == 1


# One bad file per rule: the YAML delta on top of `tiny`, and the field path the error must name.
BAD = [
    ("model: {hidden_size: 250}", "model.hidden_size"),  # not divisible by 4 heads
    ("model: {num_layers: 1}", "model.num_layers"),  # fewer blocks than PP=2 stages
    ("parallel: {partition_method: 'type:attention'}", "parallel.partition_method"),  # matches no layer class
    ("parallel: {tensor: 3}", "parallel.tensor"),  # does not divide 4 heads
    ("model: {ffn_hidden_size: 1023}\nparallel: {tensor: 2}", "model.ffn_hidden_size"),
    ("model: {max_position_embeddings: 64}", "model.max_position_embeddings"),
    ("model: {hidden_dropout: 1.5}", "model.hidden_dropout"),
    ("model: {num_layers: 0}", "model.num_layers"),
    ("batch: {rampup: {start: 8, increment: 3, samples: 1000}}", "batch.rampup.increment"),
    ("batch: {rampup: {start: 32, increment: 4, samples: 1000}}", "batch.rampup.start"),
    ("train: {samples: null, iters: 100}", "batch.rampup"),  # rampup needs samples
    ("train: {samples: 100, iters: 100}", "train"),  # mutually exclusive
    ("train: {samples: null}", "train"),  # one is required
    ("train: {precision: fp16}", "train.precision"),  # fp16 on a cpu experiment
    ("train: {precision: fp64}", "train.precision"),
    ("lr_schedule: {warmup_samples: 10, warmup_iters: 2}", "lr_schedule.warmup_iters"),
    ("lr_schedule: {style: exponential}", "lr_schedule.style"),
    ("optimizer: {min_lr: 1.0}", "optimizer.min_lr"),
    ("optimizer: {beta2: 1.0}", "optimizer.beta2"),
    ("checkpoint: {save_schedule: [{until: 100, interval: 10}, {until: 50, interval: 5}]}", "checkpoint.save_schedule[1].until"),
    ("checkpoint: {save_schedule: [{until: 100, interval: 0}]}", "checkpoint.save_schedule[0].interval"),
    ("checkpoint: {save_schedule: [{until: 100}]}", "checkpoint.save_schedule[0].interval"),
    ("data: {split: '90,10'}", "data.split"),
    ("data: {tokenizer: {kind: gpt2-bpe, vocab_file: v.json}}", "data.tokenizer"),
    ("data: {blend: [{prefix: x, weight: 0}]}", "data.blend[0].weight"),
    ("slurm: {time: '20h'}", "slurm.time"),
    ("slurm: {time: '00:04:00'}", "slurm.time"),  # shorter than the exit margin
    ("slurm: {nodes: 0}", "slurm.nodes"),
    ("slurm: {device: tpu}", "slurm.device"),
    ("slurm: {env_setup: module load x}", "slurm.env_setup"),
    ("name: other", "name"),
]


@pytest.mark.parametrize("delta, field", BAD, ids=[f for _, f in BAD])
def test_each_rule_names_its_field(trainings: Path, delta: str, field: str) -> None:
    write(trainings, "bad", "base: tiny\n" + delta + "\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("bad", trainings)
    assert err.value.field == field, str(err.value)
    assert err.value.source.endswith(".yaml")
    assert err.value.allowed


# ----------------------------------------------------------------------------- where relative paths resolve


def _resolved(exp) -> dict[str, str | None]:
    """Every path loading resolves: the inputs, then the outputs."""
    return {"blend": exp.data.blend[0].prefix, "tokenizer": exp.data.tokenizer.json_file,
            **{k: getattr(exp.paths, k) for k in ("output", "checkpoints", "tensorboard", "logs", "codecarbon")},
            "kill_switch": exp.checkpoint.kill_switch_path, "backup": exp.backup.dest, "cache": exp.data.cache_dir}


def _expected(inputs: Path, run: Path, backup: Path | None = None, cache: Path | None = None) -> dict[str, str | None]:
    return {"blend": str(inputs / "corpus" / "build" / "tiny_text_document"),
            "tokenizer": str(inputs / "corpus" / "tokenizer.json"),
            "output": str(run), **{k: str(run / k) for k in ("checkpoints", "tensorboard", "logs", "codecarbon")},
            "kill_switch": str(run / "kill-switch"), "backup": backup and str(backup), "cache": cache and str(cache)}


@pytest.fixture
def project(repo_root: Path, tmp_path: Path, monkeypatch) -> Path:
    """A user's project folder holding a copy of tiny in its own trainings/, and the test in another folder."""
    monkeypatch.delenv("BSOPS_DATA_DIR", raising=False)
    folder = tmp_path / "project"
    (folder / "trainings").mkdir(parents=True)
    shutil.copy(repo_root / "trainings" / "tiny.yaml", folder / "trainings")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return folder


def test_a_copy_of_tiny_resolves_against_its_project_folder_from_any_folder(project: Path, monkeypatch) -> None:
    write(project / "trainings", "mine", """
        base: tiny
        paths: {output: scratch/mine}
        backup: {dest: backups/mine}
        data: {cache_dir: index-cache}
    """)
    corpus = resources.bundled("corpus").resolve()
    # The project has no corpus/: the inputs are the bundled corpus's; the outputs are the project's.
    copy = load_experiment("tiny", project / "trainings")
    assert _resolved(copy) == _expected(corpus.parent, project / "runs" / "tiny")
    mine = load_experiment("mine", project / "trainings")
    assert _resolved(mine) == _expected(corpus.parent, project / "scratch" / "mine", project / "backups" / "mine",
                                        project / "index-cache")
    monkeypatch.chdir(project)  # the same from the project folder, found as ./trainings
    assert to_dict(load_experiment("mine")) == to_dict(mine)
    # A corpus/ file the project has is the project's; a dataset it has not built stays the bundled one.
    (project / "corpus").mkdir()
    (project / "corpus" / "tokenizer.json").write_text("{}")
    own = load_experiment("tiny", project / "trainings")
    assert own.data.tokenizer.json_file == str(project / "corpus" / "tokenizer.json")
    assert own.data.blend[0].prefix == str(corpus / "build" / "tiny_text_document")
    (project / "corpus" / "build").mkdir()
    (project / "corpus" / "build" / "tiny_text_document.idx").write_bytes(b"")
    built = load_experiment("tiny", project / "trainings")
    assert built.data.blend[0].prefix == str(project / "corpus" / "build" / "tiny_text_document")


def _bundled_folder(repo_root: Path, folder: Path) -> Path:
    """What a wheel or a site's $BSOPS_DATA_DIR holds, as far as tiny's paths go."""
    (folder / "trainings").mkdir(parents=True)
    (folder / "corpus").mkdir()
    shutil.copy(repo_root / "trainings" / "tiny.yaml", folder / "trainings")
    shutil.copy(repo_root / "corpus" / "tokenizer.json", folder / "corpus")
    return folder


@pytest.mark.parametrize("kind", ["checkout", "wheel", "data-dir"])
def test_bundled_tiny_resolves_alike_for_every_install_kind(kind: str, project: Path, repo_root: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    """The bundled tiny reads its bundled folder and writes under the current folder. An editable install
    is the checkout case (its package, so its bundled folders, are the source tree's); a wheel's folders
    are bigscience_ops/bundled/ (resources.INSTALLED) with no checkout; $BSOPS_DATA_DIR wins over both."""
    monkeypatch.delenv("BSOPS_TRAININGS", raising=False)
    data = repo_root
    if kind == "wheel":
        data = _bundled_folder(repo_root, tmp_path / "site-packages" / "bigscience_ops" / "bundled")
        monkeypatch.setattr(resources, "INSTALLED", data)
        monkeypatch.setattr(resources, "CHECKOUT", tmp_path / "no-checkout")
    elif kind == "data-dir":
        data = _bundled_folder(repo_root, tmp_path / "site-data")
        monkeypatch.setenv("BSOPS_DATA_DIR", str(data))
    here = Path.cwd()
    assert resources.bundled("trainings").resolve() == data / "trainings"
    assert _resolved(load_experiment("tiny")) == _expected(data, here / "runs" / "tiny")
    # Named by its path, from the project folder: the same rule, not the project's.
    monkeypatch.chdir(project)
    by_path = load_experiment(str(data / "trainings" / "tiny.yaml"))
    assert _resolved(by_path) == _expected(data, project / "runs" / "tiny")


# ----------------------------------------------------------------------------- finding experiments by name

def test_bundled_experiments_stay_reachable_beside_a_local_trainings_folder(tmp_path: Path, monkeypatch) -> None:
    """A user's ./trainings is looked in first, then bsops' own: a local file of the same name wins there, and
    `base:` follows the same rule after the folder of the file that names it."""
    from bigscience_ops.config.files import experiment_path, find_experiments, run_folder_note

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BSOPS_TRAININGS", raising=False)
    bundled = resources.bundled("trainings")
    local = tmp_path / "trainings"
    local.mkdir()
    write(local, "myrun", "base: tr1-13B\n")
    assert {"myrun", "tiny", "tr1-13B"} <= set(list_experiments())
    assert experiment_path("tiny") == bundled / "tiny.yaml"
    assert load_experiment("myrun").model.hidden_size == 5120  # a bundled base, from the user's folder
    write(local, "tiny", "base: tiny\ndescription: mine\n")  # mine now, on the bundled one: it wins, by name and as a base
    write(local, "other", "base: tiny\n")
    assert experiment_path("tiny") == local / "tiny.yaml" and load_experiment("other").description == "mine"
    write(local, "tr1-13B", "base: tiny\n")  # a local shadow of a base bundled experiments name
    assert load_experiment("tr8-104B").model.seq_length == 2048  # a bundled file's base is its bundled sibling
    assert load_experiment("myrun").model.seq_length == 128  # the user's own file finds the user's own base
    assert load_experiment("tiny").model.hidden_size == 256 and load_experiment("tiny").description == "mine"
    found = {(f.name, f.bundled): f for f in find_experiments()}
    assert found["tiny", True].shadowed_by == local / "tiny.yaml" and found["tiny", False].shadowed_by is None
    assert found["tr1-13B", True].shadowed_by == local / "tr1-13B.yaml" and not found["myrun", False].bundled
    assert found["tr8-104B", True].shadowed_by is None
    with pytest.raises(ConfigError) as err:
        load_experiment("nosuch")
    assert f"no such experiment in {local} or {bundled}" in str(err.value) and "myrun" in str(err.value)
    write(local, "broken", "base: nosuch\n")
    with pytest.raises(ConfigError, match=r"base: got 'nosuch'; no such experiment"):
        load_experiment("broken")

    # The run folder each one uses, and the rule that chose it (docs/OPERATOR.md, "Where paths resolve").
    assert run_folder_note(local / "myrun.yaml", load_experiment("myrun")) == (
        f"run folder: {tmp_path}/runs/myrun (relative paths of {local}/myrun.yaml resolve against {tmp_path})")
    assert run_folder_note(bundled / "tr1-13B-short.yaml", load_experiment("tr1-13B-short")) == (
        f"run folder: {tmp_path}/runs/tr1-13B-short (tr1-13B-short is bundled with bsops: its runs go under the "
        "current folder)")
    (local / "tiny.yaml").unlink()
    assert run_folder_note(bundled / "tiny.yaml", load_experiment("tiny")) == (
        f"run folder: {tmp_path}/runs/tiny (tiny is bundled with bsops: its runs go under the current folder)")


def test_a_mapping_field_a_file_sets_replaces_its_bases_whole(trainings) -> None:
    """eval.sources of an experiment based on tiny is its own (tiny's held-out sources not added); a section set
    around it still merges key by key, and a file that leaves the mapping out inherits it."""
    (trainings / "own.yaml").write_text("base: tiny\neval: {sources: {held: held.jsonl}, every_saves: 2}\n")
    (trainings / "kept.yaml").write_text("base: tiny\neval: {every_saves: 3}\n")
    own, kept, tiny = (load_experiment(name, trainings) for name in ("own", "kept", "tiny"))
    assert list(own.eval.sources) == ["held"] and own.eval.every_saves == 2 and own.eval.tasks == tiny.eval.tasks
    assert kept.eval.sources == tiny.eval.sources and kept.eval.every_saves == 3


SECRET = "root:x:0:0:the-secret-line"  # what a file a link names holds: no error may show it


def _secret_file(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "passwd"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(f"{SECRET}\nmodel: {{hidden_size: [\n")
    return secret


@pytest.mark.parametrize("what", ["a link to a file", "a link to a YAML experiment", "a dangling link", "a link loop",
                                  "a FIFO", "a folder"])
@pytest.mark.parametrize("as_base", [False, True])
def test_an_experiment_file_or_base_that_is_not_a_plain_file_is_refused_by_what_it_is(
        trainings: Path, tmp_path: Path, what: str, as_base: bool) -> None:
    """Read through a link, an experiment or its base could be any file, and YAML's errors quoted its first line.
    It is refused like a run's files are, naming the path and what is there, never what it holds; a FIFO is not
    waited on."""
    import os

    path = trainings / "odd.yaml"
    if what == "a link to a file":
        path.symlink_to(_secret_file(tmp_path))
    elif what == "a link to a YAML experiment":
        path.symlink_to(trainings / "tiny.yaml")
    elif what == "a dangling link":
        path.symlink_to(tmp_path / "nowhere.yaml")
    elif what == "a link loop":
        path.symlink_to(path.name)
    elif what == "a FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()
    name = write(trainings, "child", "base: odd\n") if as_base else "odd"
    with pytest.raises(ConfigError) as err:
        load_experiment(name, trainings)
    assert err.value.source == str(path) and err.value.field == "" and "plain file" in err.value.allowed
    assert SECRET not in str(err.value) and "the-secret" not in str(err.value)
    assert os.path.lexists(path)  # nothing removed or replaced


def test_a_yaml_error_names_line_and_column_and_shows_no_line_of_the_file(trainings: Path) -> None:
    write(trainings, "broken", f"# {SECRET}\nmodel: {{hidden_size: [1,\n  {SECRET}: b: c\n")
    with pytest.raises(ConfigError) as err:
        load_experiment("broken", trainings)
    assert "line 3" in err.value.allowed and "the-secret" not in str(err.value) and "\n" not in str(err.value)


def test_a_trainings_folder_that_is_not_there_is_refused_by_every_command_that_takes_it(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """It used to leave only the bundled folder to look in: `plan tiny --trainings-dir /typo` planned bsops' own
    tiny, and a cron job whose folder had gone watched the bundled experiment of the name, silently."""
    from click.testing import CliRunner

    from bigscience_ops.cli import main

    missing = tmp_path / "no-such-trainings"
    (tmp_path / "a-file").write_text("")
    runner = CliRunner()
    for args in (["plan", "tiny"], ["show", "tiny"], ["render", "tiny"], ["status", "tiny"], ["info", "tiny"],
                 ["eval", "next", "tiny"], ["hub-sync", "tiny"], ["backup", "tiny"], ["cron", "add", "tiny"],
                 ["launch", "tiny", "--dry-run"], ["list"], ["data", "verify", "x", "--experiment", "tiny"]):
        for folder in (missing, tmp_path / "a-file"):
            result = runner.invoke(main, [*args, "--trainings-dir", str(folder)])
            assert result.exit_code == 2 and str(folder) in result.stderr, (args, result.output)
            assert len(result.stderr.splitlines()) == 1 and not missing.exists()
    monkeypatch.setenv("BSOPS_TRAININGS", str(missing))
    assert runner.invoke(main, ["plan", "tiny"]).exit_code == 2
    assert runner.invoke(main, ["plan", "tiny", "--trainings-dir", str(tmp_path)]).exit_code == 0  # given: it wins
    monkeypatch.delenv("BSOPS_TRAININGS")
    assert runner.invoke(main, ["plan", "tiny"]).exit_code == 0  # ./trainings, the default, may be missing
