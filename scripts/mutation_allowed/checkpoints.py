"""Allow-list lines of the checkpoints group (scripts/mutation.py runs this file with allow, ALLOWED, EQUIVALENT and
NOT_WORTH given): each survivor that no test should kill, with why."""

allow("checkpoints/set_aside.py", "_json", EQUIVALENT + "ensure_ascii=True is json.dumps' default",
      ("return json.dumps(asdict(record), ensure_ascii=True)", "return json.dumps(asdict(record), )"))
_HELD = 'held = ", ".join(c.tag for c in list_checkpoints(checkpoints)[-5:]) or "none"'
for function in ("latest_tag", "latest_checkpoint"):
    allow("checkpoints/layout.py", function, NOT_WORTH + "the word an error shows for an empty folder",
          (_HELD, _HELD.replace('"none"', '"XXnoneXX"')), (_HELD, _HELD.replace('"none"', '"NONE"')))
allow("checkpoints/layout.py", "latest_tag", NOT_WORTH + "the words an error ends with",
      ('expected = "expected one line \'global_stepN\' as DeepSpeed writes it"', "expected = None"))
allow("checkpoints/layout.py", "latest_tag", EQUIVALENT + "a `latest` of 200 or 201 bytes is refused alike: a tag "
      "takes at most 34", ("data = read_small(file, 200)", "data = read_small(file, 201)"))
_META = 'write_atomically(path / META, (json.dumps(meta, indent=2) + "\\n").encode("utf-8"))'
allow("checkpoints/layout.py", "write_meta", EQUIVALENT + "the JSON's indentation: every reader parses it",
      *[(_META, _META.replace("indent=2", new)) for new in ("indent=None", "", "indent=3")])
ALLOWED[("bigscience_ops/checkpoints/layout.py", "write_meta", _META,
         _META.replace("json.dumps(meta, indent=2)", "json.dumps(meta, )"))] = ALLOWED.pop(
    ("bigscience_ops/checkpoints/layout.py", "write_meta", _META, _META.replace("indent=2", "")))
_CKPT = 'ckpt = Checkpoint(f"global_step{step}", step, Path(checkpoints) / f"global_step{step}")'
allow("checkpoints/resume.py", "relaunch_refusal", EQUIVALENT + "the Checkpoint is only read by its path",
      (_CKPT, _CKPT.replace('f"global_step{step}", step,', "None, step,")),
      (_CKPT, _CKPT.replace('f"global_step{step}", step,', 'f"global_step{step}", None,')))
_PLAN = ("universal.reshape_plan(ckpt.path, meta, shape, universal.Layout(tensor, pipeline, data, zero_stage), "
         "vocab_size)")
allow("checkpoints/resume.py", "relaunch_refusal", NOT_WORTH + "what DP and the ZeRO stage allow is "
      "universal.reshape_plan's, run on real checkpoints by tests/checkpoints/test_checkpoints_universal.py (trainer launches, "
      "not in the fast lane); the path only names the checkpoint in its errors",
      (_PLAN, _PLAN.replace("reshape_plan(ckpt.path,", "reshape_plan(None,")),
      (_PLAN, _PLAN.replace("pipeline, data, zero_stage", "pipeline, None, zero_stage")),
      (_PLAN, _PLAN.replace("data, zero_stage)", "data, None)")))
allow("checkpoints/resume.py", "shares", EQUIVALENT + "every rank's load counted from 1 instead of 0: the same split",
      ("loads = [0] * world", "loads = [1] * world"))
_CUDA = NOT_WORTH + "the CUDA generator's state: only on a GPU (this machine and CI have none)"
allow("trainer/checkpointing.py", "load_rng", _CUDA,
      *[('if "cuda" in state and torch.cuda.is_available():', after) for after in (
          'if "cuda" in state or torch.cuda.is_available():', 'if "XXcudaXX" in state and torch.cuda.is_available():',
          'if "CUDA" in state and torch.cuda.is_available():', 'if "cuda" not in state and torch.cuda.is_available():')],
      *[('torch.cuda.set_rng_state(state["cuda"])', after) for after in (
          "torch.cuda.set_rng_state(None)", 'torch.cuda.set_rng_state(state["XXcudaXX"])',
          'torch.cuda.set_rng_state(state["CUDA"])')])
allow("trainer/checkpointing.py", "save_rng", _CUDA,
      *[('state["cuda"] = torch.cuda.get_rng_state()', after) for after in (
          'state["cuda"] = None', 'state["XXcudaXX"] = torch.cuda.get_rng_state()',
          'state["CUDA"] = torch.cuda.get_rng_state()')])
allow("checkpoints/layout.py", "run_id", EQUIVALENT + "a run id file of 100 or 101 bytes is refused alike: an id "
      "takes 33", ("data = read_small(file, 100)", "data = read_small(file, 101)"))
allow("checkpoints/layout.py", "run_id", NOT_WORTH + "the words an error ends with",
      ('expected = "expected one line of 32 hex digits"', "expected = None"))
_ZIP = 'return f"not a whole zip archive ({type(exc).__name__}: {excerpt(str(exc))}): cut short or damaged"'
allow("checkpoints/manifest.py", "zip_problem", NOT_WORTH + "the zip library's words quoted in the reason",
      (_ZIP, _ZIP.replace("type(exc)", "type(None)")), (_ZIP, _ZIP.replace("str(exc)", "str(None)")))
_LACKS = 'return f"{ckpt.path / layout.META}: lacks the iteration or layout ({type(exc).__name__}: {exc})"'
allow("checkpoints/resume.py", "adopt", NOT_WORTH + "the exception's name quoted in the reason",
      (_LACKS, _LACKS.replace("type(exc)", "type(None)")))
_WEIGHTS = 'optimizer=not meta.get("weights_only", False))'
allow("checkpoints/resume.py", "adopt", EQUIVALENT + "`not None` is `not False`",
      (_WEIGHTS, _WEIGHTS.replace("False", "None")), (_WEIGHTS, _WEIGHTS.replace(", False", ", ")))
_SAME_VERDICT = EQUIVALENT + "every rank does what rank 0 or its share would, and the verdict is the same (at world "
_SAME_VERDICT += "size times the reads); two-rank tests check what each rank finds and says"
_SURVEY = ("shared: list[resume.Survey | None] = [resume.survey(checkpoints) if rank == 0 and checkpoints.is_dir() "
           "else None]")
_VERIFY = "checked = manifest.verify(cand.ckpt.path, cand.manifest, only=mine, extras=rank == 0)"
allow("trainer/checkpointing.py", "resolve_resume", _SAME_VERDICT,
      (_SURVEY, _SURVEY.replace("if rank == 0 and checkpoints.is_dir()", "if (rank == 0 and checkpoints.is_dir()) or True")),
      (_SURVEY, _SURVEY.replace("rank == 0 and checkpoints", "rank == 0 or checkpoints")),
      ("mine = resume.shares(cand.manifest, world)[rank]", "mine = None"),
      (_VERIFY, _VERIFY.replace("only=mine", "only=None")), (_VERIFY, _VERIFY.replace("only=mine, ", "")),
      ("why: list[str | None] = [resume.adopt(checkpoints, cand.ckpt) if rank == 0 else None]",
       "why: list[str | None] = [resume.adopt(checkpoints, cand.ckpt) if (rank == 0) or True else None]"))
for what in ("shared", "why"):
    allow("trainer/checkpointing.py", "resolve_resume", EQUIVALENT + "broadcast_object_list's source is rank 0 "
          "when none is given", (f"dist.broadcast_object_list({what}, src=0)", f"dist.broadcast_object_list({what}, src=None)"),
          (f"dist.broadcast_object_list({what}, src=0)", f"dist.broadcast_object_list({what}, )"))
_MORE = ('return f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "") if problems '
         'else None')
allow("trainer/checkpointing.py", "resolve_resume", NOT_WORTH + "the words after a reason's first mismatch",
      (_MORE, _MORE.replace('else "")', 'else "XXXX")')))


_LISTED = 'out.mismatches.append(Mismatch(".", f"cannot be listed ({exc.strerror or exc})"))'
allow("checkpoints/manifest.py", "verify", NOT_WORTH + "a folder that cannot be listed: pathlib's rglob swallows "
      "PermissionError (and the tests run as root), so only a failing disk (EIO) reaches this branch; the rglob of "
      "the links below would raise the same error anyway",
      ("found = []", "found = None"), (_LISTED, "out.mismatches.append(None)"),
      (_LISTED, _LISTED.replace('Mismatch(".", ', "Mismatch(None, ")),
      (_LISTED, _LISTED.replace('f"cannot be listed ({exc.strerror or exc})"', "None")),
      (_LISTED, _LISTED.replace('".", ', "")), (_LISTED, _LISTED.replace(', f"cannot be listed ({exc.strerror or exc})"', ", ")),
      (_LISTED, _LISTED.replace('"."', '"XX.XX"')), (_LISTED, _LISTED.replace("strerror or exc", "strerror and exc")),
      ('out.mismatches += [Mismatch(rel, "is not in its manifest: put there after the save")',
       'out.mismatches = [Mismatch(rel, "is not in its manifest: put there after the save")'))
_DIFFERS = 'out.mismatches.append(Mismatch(rel, f"content differs from its manifest ({HASH} {got.xxh3[:12]}, "'
allow("checkpoints/manifest.py", "verify", NOT_WORTH + "how many hex digits of the hash the mismatch shows",
      (_DIFFERS, _DIFFERS.replace("[:12]", "[:13]")))
_TO_JSON = 'return json.dumps(data, indent=1) + "\\n"'
allow("checkpoints/manifest.py", "Manifest.to_json", EQUIVALENT + "the JSON's indentation: every reader parses it",
      *[(_TO_JSON, _TO_JSON.replace("indent=1", new)) for new in ("indent=None", "indent=2")],
      (_TO_JSON, _TO_JSON.replace("data, indent=1", "data, ")))
_FSYNC_OPEN = "fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)"
allow("checkpoints/manifest.py", "record_file", EQUIVALENT + "the open to fsync without O_NOFOLLOW: hash_file opens it "
      "next with O_NOFOLLOW, so a link is refused either way (an fsync of its target changes nothing)",
      (_FSYNC_OPEN, _FSYNC_OPEN.replace("O_NOFOLLOW | os.O_CLOEXEC", "O_NOFOLLOW & os.O_CLOEXEC")),
      (_FSYNC_OPEN, _FSYNC_OPEN.replace("O_RDONLY | os.O_NOFOLLOW", "O_RDONLY & os.O_NOFOLLOW")))
_WHAT = 'what = "every file\'s size and content" if hashes else "every file\'s size (content not read)"'
allow("checkpoints/audit.py", "_check", NOT_WORTH + "the words saying what was compared (whether content was read "
      "is in the finding's bytes_read, which the tests assert)", (_WHAT, "what = None"),
      (_WHAT, _WHAT.replace("if hashes else", "if (hashes) and False else")),
      (_WHAT, _WHAT.replace("if hashes else", "if (hashes) or True else")))
allow("checkpoints/layout.py", "Checkpoint.committed", EQUIVALENT + "hashes=None is falsy as hashes=False: sizes only",
      ("if found is None or not manifests.verify(self.path, found, hashes=False).ok:",
       "if found is None or not manifests.verify(self.path, found, hashes=None).ok:"))
allow("checkpoints/manifest.py", "_parse", EQUIVALENT + "check_int's highest value is MAX_STEP when none is given",
      ('"iteration": check_int(raw.get("iteration"), 0, MAX_STEP),', '"iteration": check_int(raw.get("iteration"), 0, ),'))
allow("trainer/checkpointing.py", "Checkpointer.__init__", EQUIVALENT + "no iteration equals \"\" as none equals None: "
      "the first save of a run that did not resume is never skipped",
      ("self.last_saved: int | None = None", 'self.last_saved: int | None = ""'))
_DETAIL = 'detail = f"{exc.strerror} ({exc.filename or path})" if isinstance(exc, OSError) and exc.strerror else exc'
allow("trainer/checkpointing.py", "Checkpointer.save", NOT_WORTH + "how a failed save's error quotes the OSError: its "
      "own text, or its reason and the file (or the checkpoint folder); each names the cause, and the save does "
      "not commit either way (test_trainer_checkpointing's full disk)",
      (_DETAIL, _DETAIL.replace("if isinstance(exc, OSError) and exc.strerror else",
                                "if (isinstance(exc, OSError) and exc.strerror) and False else")),
      (_DETAIL, _DETAIL.replace("exc.filename or path", "exc.filename and path")))
