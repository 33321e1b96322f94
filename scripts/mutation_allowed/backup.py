"""Allow-list lines of the backup group (scripts/mutation.py runs this file with allow, ALLOWED, EQUIVALENT and
NOT_WORTH given): each survivor that no test should kill, with why."""

allow("checkpoints/retention.py", "decide", EQUIVALENT + "the step `latest` names is kept by the branch before",
      ("elif step > latest_step:", "elif step >= latest_step:"))
allow("checkpoints/retention.py", "decide", EQUIVALENT + "without keep_last every step is in `newest`, kept either "
      "way; only the reason's words differ",
      ('keep[step] = "one of the newest" if keep_last else "no keep_last: nothing is deleted"',
       'keep[step] = "one of the newest" if (keep_last) and False else "no keep_last: nothing is deleted"'),
      ('keep[step] = "one of the newest" if keep_last else "no keep_last: nothing is deleted"',
       'keep[step] = "one of the newest" if (keep_last) or True else "no keep_last: nothing is deleted"'))
allow("ops/keep/store.py", "_manifest_problem", EQUIVALENT + "MAX_STEP is check_int's default upper bound",
      ('why = check_int(manifest.get("step"), 0, MAX_STEP)', 'why = check_int(manifest.get("step"), 0, )'))
allow("ops/keep/store.py", "_manifest_problem", EQUIVALENT + "check_time('') is a problem as None is",
      ("verified = None", 'verified = ""'))
allow("ops/keep/store.py", "verify_tar", EQUIVALENT + "one read of the whole member: the same size and digest "
      "(what CHUNK bounds is the memory)",
      ("while chunk := handle.read(CHUNK):", "while chunk := handle.read(None):"))
allow("ops/keep/store.py", "hashes", EQUIVALENT + "one read of the whole file: the same size and digests",
      ("while chunk := handle.read(CHUNK):", "while chunk := handle.read(None):"))
allow("ops/keep/backup.py", "_copy_file", EQUIVALENT + "one read of the whole file: the same bytes copied and hashed",
      ("while chunk := reader.read(CHUNK):", "while chunk := reader.read(None):"))
for codec_user in (("ops/keep/store.py", "manifest_checked", 'manifest = json.loads(data.decode("utf-8"))'),
                   ("checkpoints/layout.py", "write_latest",
                    'write_atomically(Path(checkpoints) / LATEST, tag.encode("utf-8"))')):
    allow(codec_user[0], codec_user[1], EQUIVALENT + "codec names are case-insensitive",
          (codec_user[2], codec_user[2].replace('"utf-8"', '"UTF-8"')))
_LOAD = 'state = torch.load(src, map_location="cpu", weights_only=True)'
allow("ops/keep/backup.py", "_write_weights_only", NOT_WORTH + "map_location matters only for a file saved from "
      "CUDA tensors, which a test on this CPU-only machine cannot write (the GPU acceptance run backs up its own)",
      (_LOAD, 'state = torch.load(src, map_location=None, weights_only=True)'),
      (_LOAD, 'state = torch.load(src, weights_only=True)'))
allow("ops/keep/backup.py", "_write_weights_only", EQUIVALENT + "weights_only=True is torch's default since 2.6 "
      "(pyproject pins torch 2.13)",
      (_LOAD, 'state = torch.load(src, map_location="cpu", weights_only=None)'),
      (_LOAD, 'state = torch.load(src, map_location="cpu", )'))
allow("checkpoints/retention.py", "_delete", NOT_WORTH + "which words of the OSError a refusal shows (its strerror, "
      "or the whole error, which holds the same words); the refusal, its folder and its path are asserted",
      ('done.refused[path.name] = f"{path} could not be deleted: {exc.strerror or exc}"',
       'done.refused[path.name] = f"{path} could not be deleted: {exc.strerror and exc}"'))
_MISMATCH = 'bad.append(f"{path}: size {size} sha256 {digest[:12]}, manifest {entry[\'size\']} {entry[\'sha256\'][:12]}")'
_NOT_AS_SAVED = 'bad.append(f"{path}: does not match the checkpoint\'s manifest (size {size}, xxh3_128 {xxh3[:12]}; "'
allow("ops/keep/store.py", "verify_folder", NOT_WORTH + "how many hex digits of a digest a mismatch shows; which file "
      "mismatches is asserted",
      (_MISMATCH, _MISMATCH.replace("{digest[:12]}", "{digest[:13]}")),
      (_MISMATCH, _MISMATCH.replace("{entry['sha256'][:12]}", "{entry['sha256'][:13]}")),
      (_NOT_AS_SAVED, _NOT_AS_SAVED.replace("{xxh3[:12]}", "{xxh3[:13]}")))
_READ = 'return (f"{src} does not match its checkpoint\'s manifest (read {size} bytes, xxh3_128 {xxh3[:12]}; saved "'
allow("ops/keep/backup.py", "_not_as_saved", NOT_WORTH + "how many hex digits of a digest the error shows; the file "
      "named and the checkpoint left uncopied are asserted",
      (_READ, _READ.replace("{xxh3[:12]}", "{xxh3[:13]}")))
allow("ops/keep/backup.py", "_write_weights_only", NOT_WORTH + "the size the error shows of a file that no longer "
      "matches its manifest; the file named and the checkpoint left uncopied are asserted",
      ("raise BackupError(_not_as_saved(src, now.size, now.xxh3, saved))",
       "raise BackupError(_not_as_saved(src, None, now.xxh3, saved))"))
allow("ops/keep/backup.py", "_write_weights_only", NOT_WORTH + "where the loader's reason is cut (300 characters or "
      "301): only its length in the error changes",
      ('why = " ".join(str(exc).split())[:300]', 'why = " ".join(str(exc).split())[:301]'))
allow("ops/keep/backup.py", "_copy_kind", EQUIVALENT + "with no entry found, read_manifest(store, None) reads "
      "<store>/None.manifest.json, which no copy is named (the backup names entries global_stepN[.K]): None either way",
      ("found = read_manifest(store, entry) if entry is not None else None",
       "found = read_manifest(store, entry) if (entry is not None) or True else None"))
_MARKER = '(dest / STORE_MARKER).write_text(json.dumps({"bsops": "backup store", "version": 2}) + "\\n", encoding="utf-8")'
allow("ops/keep/store.py", "open_store", EQUIVALENT + "the marker is ASCII JSON: every encoding writes the same bytes",
      (_MARKER, _MARKER.replace('encoding="utf-8"', "encoding=None")),
      (_MARKER, _MARKER.replace(', encoding="utf-8"', ", ")))
allow("ops/keep/backup.py", "_copy_checkpoint", EQUIVALENT + "<store>/None.manifest.json is no entry's manifest (the "
      "backup names entries global_stepN[.K]): missing either way, as the entry's own is here",
      ("if final.is_dir() and not manifest_path(dest, entry).exists():",
       "if final.is_dir() and not manifest_path(dest, None).exists():"))
_STAGING = "staging.parent.mkdir(parents=True, exist_ok=True)"
allow("ops/keep/backup.py", "_copy_checkpoint", EQUIVALENT + "the run store, .partial's parent, exists: run_backup "
      "makes it before any copy",
      (_STAGING, "staging.parent.mkdir(parents=None, exist_ok=True)"), (_STAGING, "staging.parent.mkdir(exist_ok=True)"),
      (_STAGING, "staging.parent.mkdir(parents=False, exist_ok=True)"))
_SOURCE = '(staging / SOURCE).write_text(json.dumps({"tag": tag, "source_files": plan.source}), encoding="utf-8")'
_JOURNAL = 'with open(staging / JOURNAL, "a", encoding="utf-8") as journal:'
allow("ops/keep/backup.py", "_copy_checkpoint", EQUIVALENT + "json.dumps writes ASCII: every encoding writes the "
      "same bytes",
      (_SOURCE, _SOURCE.replace('encoding="utf-8"', "encoding=None")), (_SOURCE, _SOURCE.replace(', encoding="utf-8"', ", ")),
      (_JOURNAL, _JOURNAL.replace('encoding="utf-8"', "encoding=None")), (_JOURNAL, _JOURNAL.replace(' encoding="utf-8"', " ")))
allow("ops/keep/backup.py", "_copy_checkpoint", NOT_WORTH + "differs only when removing a staged copy fails, which no "
      "test can make happen to root in a temporary folder; the error raised is the same",
      ("shutil.rmtree(staging, ignore_errors=True)  # nothing of a checkpoint that is not as saved is kept",
       "shutil.rmtree(staging, ignore_errors=None)  # nothing of a checkpoint that is not as saved is kept"))
_NULL = 'read_small(staged / SOURCE, MANIFEST_LIMIT) or b"null") == {"tag": ckpt.tag,'
allow("ops/keep/backup.py", "_entry_for", EQUIVALENT + "a staged folder without its record is passed over either "
      "way: null is no match, and text that is no JSON is a ValueError passed over",
      (_NULL, _NULL.replace('b"null"', 'b"XXnullXX"')), (_NULL, _NULL.replace('b"null"', 'b"NULL"')))
_DROP = "shutil.rmtree(staging, ignore_errors=True)  # nothing of a checkpoint that is not as saved is kept"
allow("ops/keep/backup.py", "_copy_checkpoint", NOT_WORTH + "differs only when removing a staged copy fails (never "
      "for root in a temporary folder); the error raised is the same",
      (_DROP, "shutil.rmtree(staging, )  # nothing of a checkpoint that is not as saved is kept"),
      (_DROP, "shutil.rmtree(staging, ignore_errors=False)  # nothing of a checkpoint that is not as saved is kept"))
_BAD = 'raise BackupError(f"the copy of {plan.ckpt.path} does not match its source: {\'; \'.join(bad[:5])}; "'
allow("ops/keep/backup.py", "_copy_checkpoint", NOT_WORTH + "how many mismatches the error lists (5 or 6)",
      (_BAD, _BAD.replace("bad[:5]", "bad[:6]")))
allow("ops/keep/backup.py", "_copy_file", NOT_WORTH + "the size the error shows; the file named and the checkpoint "
      "left uncopied are asserted",
      ("raise BackupError(_not_as_saved(src, size, fast.hexdigest(), saved))",
       "raise BackupError(_not_as_saved(src, None, fast.hexdigest(), saved))"))
_ADD = "archive.add(staging / rel, arcname=rel, recursive=False)"
allow("ops/keep/backup.py", "_copy_checkpoint", EQUIVALENT + "every name added is a file (the plan lists files), and "
      "recursive only matters for a folder",
      (_ADD, _ADD.replace("recursive=False", "recursive=None")), (_ADD, _ADD.replace(", recursive=False", ", ")),
      (_ADD, _ADD.replace("recursive=False", "recursive=True")))
_STORE_MANIFEST = 'write_atomically(manifest_path(dest, entry), (json.dumps(manifest, indent=1) + "\\n").encode("utf-8"))'
allow("ops/keep/backup.py", "_copy_checkpoint", EQUIVALENT + "the JSON's indentation: every reader parses it",
      (_STORE_MANIFEST, _STORE_MANIFEST.replace("indent=1", "indent=None")),
      (_STORE_MANIFEST, _STORE_MANIFEST.replace("json.dumps(manifest, indent=1)", "json.dumps(manifest, )")),
      (_STORE_MANIFEST, _STORE_MANIFEST.replace("indent=1", "indent=2")))
allow("ops/keep/backup.py", "_copy_checkpoint", NOT_WORTH + "only a race: a folder without a manifest under the "
      "entry's name was moved into staging above, and the entry is one no manifest names, so `final` exists here only "
      "if something made it between those lines",
      ("shutil.rmtree(final)", "shutil.rmtree(None)"))
allow("ops/keep/backup.py", "_not_as_committed", EQUIVALENT + "hashes=None is falsy as False is: sizes only",
      ("bad = manifest.verify(ckpt.path, found, hashes=False).mismatches",
       "bad = manifest.verify(ckpt.path, found, hashes=None).mismatches"))
_WALK = "for root, dirs, files in os.walk(ckpt.path, followlinks=False):"
allow("ops/keep/backup.py", "fingerprint", EQUIVALENT + "a link among a folder's entries raises before os.walk "
      "could go into it, so following links or not walks the same folders",
      (_WALK, _WALK.replace("followlinks=False", "followlinks=None")), (_WALK, _WALK.replace(", followlinks=False", ", ")),
      (_WALK, _WALK.replace("followlinks=False", "followlinks=True")))
_PLAN = "report.planned.append(plan_checkpoint(ckpt, keeps_optimizer(run, ckpt.step), source))"
allow("ops/keep/backup.py", "run_backup", EQUIVALENT + "without `source` the plan takes the fingerprint again, of the "
      "same files a moment later",
      (_PLAN, _PLAN.replace(", source))", ", None))")), (_PLAN, _PLAN.replace(", source))", ", ))")))
allow("ops/keep/backup.py", "run_backup", NOT_WORTH + "a global_stepN that is a link is refused either way: by its "
      "refusal here, else by fingerprint (test_ops_backup_trust's link rows); only the words differ",
      ("refusal = ckpt.refusal()", "refusal = None"))
allow("ops/keep/backup.py", "_retention", NOT_WORTH + "the words of a damaged checkpoint's kept reason (the mismatch "
      "quoted); the decision to keep it is the same",
      ("return str(bad[0]) if bad else None", "return str(None) if bad else None"))
allow("ops/keep/backup.py", "run_backup", NOT_WORTH + "only a race: _not_as_committed has just walked the same folder "
      "(a link or a file it cannot read is refused there, test_kills_backup's link row), so fingerprint fails here "
      "only if the folder changed in between",
      ("report.failed[ckpt.tag] = str(exc)", "report.failed[ckpt.tag] = None"),
      ("report.failed[ckpt.tag] = str(exc)", "report.failed[ckpt.tag] = str(None)"))
ALLOWED[("bigscience_ops/ops/keep/backup.py", "run_backup", "continue", "break")] = (
    NOT_WORTH + "the `continue` after fingerprint fails: only a race (see the line above); the `continue` after "
    "_not_as_committed is killed by test_kills_backup's link row")
