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
