"""How often and how long the driver waits for its workers (one place, read by every module that waits)."""

#: How often a running cell's output and metrics are polled.
POLL_INTERVAL_S = 0.1
#: After an interrupt: how long a rank may take to stop before it is named with its stack.
INTERRUPT_WAIT_S = 2.0
#: Deadline of one control call (release, poll, stack) to a rank that should answer at once.
CONTROL_CALL_S = 5.0
#: Deadline of ``status()``'s ping of every rank, all together.
PING_S = 3.0
#: Deadline of ``interrupt()`` on every rank, all together (a rank waits up to ``INTERRUPT_WAIT_S`` itself).
INTERRUPT_CALL_S = INTERRUPT_WAIT_S + 3.0
#: Deadline of ``push()`` on every rank, all together.
PUSH_S = 120.0
#: Deadline of ``pull()`` on every asked rank, all together (a large value takes a while to copy).
PULL_S = 300.0
#: After Ctrl-C in ``BackgroundRun.wait``: how long the background cell has to end before the notebook is
#: given back (its ranks stop, then the group may re-form its process group).
STOP_WAIT_S = 30.0
#: Reading the answers of ranks that already answered a snapshot request (ready: they are only fetched).
SNAPSHOT_ANSWER_S = 30.0
#: A snapshot taken between cells, and a rollback: writing or reading every rank's state in storage.
SNAPSHOT_WRITE_S = 600.0
#: How long a background (``--async``) snapshot may take to be written, and a later call waits for it.
BACKGROUND_WRITE_S = SNAPSHOT_WRITE_S
#: A collective step (forming, joining): how often the ranks still in it are checked, and how long a rank
#: may be out of step (idle, busy with something else, or finished while its peers wait) before it is an error.
STEP_CHECK_S = 1.0
STEP_GRACE_S = 5.0
#: Before a new formation: how long a rank still in an earlier, failed one may take to give up (a worker
#: gives up forming after ``backend.FORM_TIMEOUT_S``, 30 s).
SETTLE_S = 45.0
#: A quick step of starting a worker (opening the rendezvous store, setting the run directory).
CONTROL_START_S = 60.0
#: Framework backends: how long after a peer failed the ranks still running are released from the library's
#: collective (their sockets closed under them); they are stopped at the backend's ``stop_after_peer_failure_s``.
RELEASE_PEERS_S = 2.0
#: A worker silent this long (no answer to the monitor's heartbeat) is reported unresponsive: the default of
#: ``WorkerGroup(heartbeat_timeout_s=...)``.
DEFAULT_HEARTBEAT_TIMEOUT_S = 15.0
#: The placement-group keeper (``keeper.py``, a detached actor): how often it looks at the actors whose placement
#: groups it keeps, and how long it lives without anything to watch before it ends itself.
KEEPER_POLL_S = 0.5
KEEPER_IDLE_S = 120.0
#: ``%dist_where``: how long every rank has to say where it is (a rank whose C code holds its GIL cannot).
WHERE_S = 2.0
#: How long ``py-spy dump`` may take for a rank that did not answer.
PYSPY_S = 5.0
#: A foreground cell silent this long (no output, no report) prints where every rank is, once.
QUIET_AFTER_S = 60.0
