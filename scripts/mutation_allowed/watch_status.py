"""Allow-list lines of ops/watch/status.py in the watch group (scripts/mutation.py runs this file with allow, ALLOWED,
EQUIVALENT and NOT_WORTH given): each survivor that no test should kill, with why."""

_VERB = 'verb = "is running" if job.state == "RUNNING" else f"is {job.state.lower()}"'
allow("ops/watch/status.py", "describe_job", EQUIVALENT + "the RUNNING state lower-cased is the same `is running`: "
      "whichever way a RUNNING job takes, its words are the same",
      (_VERB, _VERB.replace('if job.state == "RUNNING"', 'if (job.state == "RUNNING") and False')),
      (_VERB, _VERB.replace('"RUNNING"', '"XXRUNNINGXX"')),
      (_VERB, _VERB.replace('"RUNNING"', '"running"')))
allow("ops/watch/status.py", "describe_job", NOT_WORTH + "the case of the state's word in the line (`is completing` "
      "or `is COMPLETING`): which state it is, is said either way",
      (_VERB, _VERB.replace("job.state.lower()", "job.state.upper()")))
_LOOK = ('return (f"job {safe_id(job.job_id)} of user {job.user} ({job.state.lower()}) is a job of another run with '
         'this "')
allow("ops/watch/status.py", "_look_alike", NOT_WORTH + "the case of the state's word in the look-alike line",
      (_LOOK, _LOOK.replace("job.state.lower()", "job.state.upper()")))
_SUBMITTED = 'submitted = ", ".join(sorted(ours, key=lambda i: (len(i), i))[-3:]) or "none"'
allow("ops/watch/status.py", "_look_alike", NOT_WORTH + "the word said for no recorded array (job_ids given empty): "
      "no id is named either way",
      (_SUBMITTED, _SUBMITTED.replace('"none"', '"XXnoneXX"')),
      (_SUBMITTED, _SUBMITTED.replace('"none"', '"NONE"')))
allow("ops/watch/status.py", "evaluate", EQUIVALENT + "`other` stays the last of the four kinds: the order is the same",
      ('order = {"active": 0, "waiting": 1, "never": 2, "other": 3}',
       'order = {"active": 0, "waiting": 1, "never": 2, "other": 4}'))
_ARRAY = 'return job_id.split("_", 1)[0].split("+", 1)[0].strip()'
allow("ops/watch/status.py", "array_id", EQUIVALENT + "only the first piece ([0]) is kept: how many splits are made "
      "after it changes nothing",
      *[(_ARRAY, _ARRAY.replace(old, new)) for old, new in (
          ('split("_", 1)', 'split("_", )'), ('split("_", 1)', 'split("_", 2)'), ('split("+", 1)', 'split("+", )'),
          ('split("+", 1)', 'split("+", 2)'))])
_NOTHING = "return LogProgress(True, None, None, searched=max_bytes if st.st_size > max_bytes else None)"
allow("ops/watch/status.py", "read_progress", EQUIVALENT + "last_iteration and seen_after default to None: a None "
      "left out is the same LogProgress",
      (_NOTHING, _NOTHING.replace("True, None, None,", "True, None,")))
allow("ops/watch/status.py", "recorded_job_ids", EQUIVALENT + "the ledger's checked records hold a job_id that is a "
      "string and a next_job that is a string or None: the mutant lets an empty string through too, and array_id('') "
      "is no array (not digits), dropped below",
      ("ids.update(i for i in (record.job_id, record.next_job) if isinstance(i, str) and i)",
       "ids.update(i for i in (record.job_id, record.next_job) if isinstance(i, str) or i)"))
allow("ops/watch/status.py", "recorded_job_ids", EQUIVALENT + "the mutant takes any JSON job_id but a bool's "
      "exclusion (floats, null, lists, objects, true): str() of none of them is all digits, and only digits are kept",
      ("if isinstance(job_id, (str, int)) and not isinstance(job_id, bool):",
       "if isinstance(job_id, (str, int)) or not isinstance(job_id, bool):"))
allow("ops/watch/status.py", "_small_json", EQUIVALENT + "a byte more read past the bound: a file longer than "
      "SBATCH_RECORD_BYTES is refused either way, a shorter one read whole either way",
      ("data = os.pread(fd, SBATCH_RECORD_BYTES + 1, 0)", "data = os.pread(fd, SBATCH_RECORD_BYTES + 2, 0)"))
allow("ops/watch/status.py", "_small_json", NOT_WORTH + "O_NOCTTY and O_CLOEXEC dropped: the descriptor lives only "
      "for one read (CLOEXEC matters when another thread starts a process in that window), and a terminal in "
      "sbatch.json's place is refused as no regular file right after (NOCTTY matters only to a process without a "
      "controlling terminal); neither is seen from outside the call",
      ("fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)",
       "fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY & os.O_CLOEXEC)"))
