------------------------------ MODULE AwaStagedFollowUps ------------------------------
(***************************************************************************************)
(* ADR-046: handler-staged follow-up jobs.                                             *)
(*                                                                                     *)
(* Two stage-A jobs run attempts under a run lease. While its handler runs, an        *)
(* attempt may stage one follow-up B whose unique key it computed (the key is chosen   *)
(* nondeterministically). When the handler returns Completed the executor seals the    *)
(* staging buffer and hands it to the finalizer, which commits the lease-guarded       *)
(* completion and the staged inserts in one transaction: on the per-job path one      *)
(* transaction per job, on the batched path (issue 17) one transaction for a batch of *)
(* jobs that completes every row whose guard matches and inserts the follow-ups of    *)
(* exactly those rows. Around that:                                                   *)
(*                                                                                     *)
(*   - a try of the completion transaction can abort (deadlock, lost connection) or   *)
(*     commit with its acknowledgement lost, and finalize_with_retry tries again with *)
(*     the same sealed follow-ups, up to MaxFinalizeTries times;                       *)
(*   - rescue can take the job back from a stale attempt at any moment, and a new      *)
(*     attempt claims it under a new lease while the stale one keeps running;         *)
(*   - Client::complete_external can complete the job under a waiting handler;        *)
(*   - a B row can release its key's unique claim (a completed B is pruned, or B       *)
(*     moves to a state outside its UniqueOpts::states), after which the key can be   *)
(*     inserted again. rows holds only the B rows that hold their key: a row that     *)
(*     releases it matters to no invariant, so it leaves the set.                      *)
(*                                                                                     *)
(*   - a batch with follow-ups that fails in a way its retries cannot fix (a          *)
(*     non-duplicate insert error) rolls back, and each of its jobs falls back to the  *)
(*     per-job path.                                                                   *)
(*                                                                                     *)
(* Variant selects the correct protocol or one of six seeded bugs; each negative      *)
(* .cfg names the invariant it is expected to violate. The executable twin in         *)
(* correctness/src/lib.rs has the same state, action names and invariants and is      *)
(* what CI checks; keep the two in step.                                               *)
(*                                                                                     *)
(* Abstractions:                                                                        *)
(*   - waiting_external is folded into running: the completion guard matches only     *)
(*     state = 'running', so a handler parked in ctx.wait_for_callback and one that   *)
(*     is running are the same to every action here.                                  *)
(*   - non-Completed outcomes (RetryAfter, Snooze, Cancel, Err, panic, a poisoned     *)
(*     attempt) discard the buffer and return the job to retryable or failed under    *)
(*     the lease guard; for the rows this model tracks that is Rescue followed by the *)
(*     attempt never finalizing, so they have no action of their own.                *)
(*   - an attempt stages at most one follow-up (16 in the engine); several staged     *)
(*     follow-ups are inserted one after another in the same transaction and do not   *)
(*     change any invariant here. Deadlock between completions is a liveness matter;  *)
(*     an abort is modelled as FinalizeAbort.                                          *)
(*   - a batch's abort changes nothing in the database, so it is modelled as each of  *)
(*     its members' tries failing on its own (FinalizeAbort on the batched route).    *)
(*   - which of two batch members offering one key inserts it is fixed (the lower     *)
(*     job, then attempt): the engine uses batch order, and no invariant depends on   *)
(*     which member it is.                                                             *)
(***************************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Jobs,             \* the stage-A jobs, e.g. {1, 2}
    Keys,             \* unique keys a handler can compute for B, e.g. {"k1", "k2"}
    MaxAttempts,      \* max_attempts of each A job: claims, each under a new run lease
    MaxFinalizeTries, \* tries of finalize_with_retry (3 in the engine)
    BatchFollowUps,   \* RuntimeConfig::batch_follow_ups: completions with follow-ups
                      \* are batched (TRUE) or take the per-job transaction (FALSE)
    Variant           \* "Correct" or one of the seeded bugs in Variants

Variants ==
    { "Correct",
      "InsertBeforeCompletion",    \* the handler inserts B itself (insert_with(ctx.pool()))
      "InsertAfterCompletion",     \* B is inserted in a separate transaction after the completion
      "CompleteWithoutLeaseGuard", \* the completion matches (id, state = 'running'), not run_lease
      "DrainOnFirstAttempt",       \* the first finalize try takes the sealed follow-ups
      "BatchedPath",               \* a job that staged something takes the plain batch,
                                   \* which inserts nothing
      "BatchInsertsUnmatched" }    \* the batch inserts the follow-ups of rows whose
                                   \* guard matched nothing

NoKey == "none"   \* an empty staging buffer

ASSUME
    /\ Jobs # {}
    /\ Keys # {}
    /\ NoKey \notin Keys
    /\ MaxAttempts \in Nat \ {0}
    /\ MaxFinalizeTries \in Nat \ {0}
    /\ BatchFollowUps \in BOOLEAN
    /\ Variant \in Variants

Attempts == 1..MaxAttempts
KeyOrNone == Keys \cup {NoKey}

JobStates == {"available", "running", "completed", "failed"}
\* An attempt: idle (not claimed yet), running (handler running, buffer open),
\* finalizing (sealed, in finalize_with_retry), inserting (committed, waiting for
\* the separate insert of InsertAfterCompletion), done.
Phases == {"idle", "running", "finalizing", "inserting", "done"}
Routes == {"none", "perjob", "batched"}

VARIABLES
    jobState, \* state of each A row: available (or retryable), running, completed, failed
    lease,    \* run_lease of each A row; attempt l holds lease l
    att,      \* att[j][l]: the worker side of attempt l of job j
    rows,     \* B rows holding their key's unique claim: [job, attempt, key]
    commits   \* history: every committed handler completion, observed as it commits

vars == <<jobState, lease, att, rows, commits>>

(* staged: the staging buffer, immutable once sealed.                                   *)
(* buf:    the sealed follow-ups as the finalizer holds them for each try.              *)
(* route:  the completion path chosen at seal time.                                     *)
(* tries:  finalize tries that failed from the finalizer's point of view.                *)
AttemptRec == [phase : Phases, staged : KeyOrNone, buf : KeyOrNone, route : Routes,
               tries : 0..MaxFinalizeTries]
RowRec     == [job : Jobs, attempt : Attempts, key : Keys]
(* key:      what the attempt staged.                                                    *)
(* inserted: this completion inserted a B row for key.                                   *)
(* keyHeld:  a B row held key once the completion had committed (its own new row, or an  *)
(*           existing row its insert was deduplicated against).                          *)
(* current:  the A row was running under this attempt's lease when the completion        *)
(*           committed.                                                                  *)
CommitRec  == [job : Jobs, attempt : Attempts, key : KeyOrNone, inserted : BOOLEAN,
               keyHeld : BOOLEAN, current : BOOLEAN]

Done  == [phase |-> "done", staged |-> NoKey, buf |-> NoKey, route |-> "none", tries |-> 0]
Idle  == [Done EXCEPT !.phase = "idle"]
Fresh == [Done EXCEPT !.phase = "running"]

TypeOK ==
    /\ jobState \in [Jobs -> JobStates]
    /\ lease \in [Jobs -> 0..MaxAttempts]
    /\ att \in [Jobs -> [Attempts -> AttemptRec]]
    /\ rows \subseteq RowRec
    /\ commits \subseteq CommitRec

---------------------------------------------------------------------------------------
(* Helpers *)

\* Some row of rs holds k's unique claim (idx_awa_jobs_unique). Never NoKey.
KeyHeld(rs, k) == \E r \in rs : r.key = k

\* insert_follow_up_in_tx: insert B under a savepoint; a conflict on the unique
\* index is skipped. An empty buffer inserts nothing.
InsertFollowUp(j, l, k) ==
    IF k = NoKey \/ KeyHeld(rows, k)
        THEN rows
        ELSE rows \cup {[job |-> j, attempt |-> l, key |-> k]}

\* The completion's WHERE clause: (id, state = 'running', run_lease).
Guard(j, l) ==
    /\ jobState[j] = "running"
    /\ (Variant = "CompleteWithoutLeaseGuard" \/ lease[j] = l)

\* What a completion of attempt l of job j observes as it commits, given the rows
\* after the commit (observation only: no action reads it).
CommitRecord(j, l, after) ==
    LET k == att[j][l].staged IN
    [job      |-> j,
     attempt  |-> l,
     key      |-> k,
     inserted |-> [job |-> j, attempt |-> l, key |-> k] \in after \ rows,
     keyHeld  |-> KeyHeld(after, k),
     current  |-> jobState[j] = "running" /\ lease[j] = l]

\* Batch members are <<job, attempt>> pairs; m precedes o in batch order.
Precedes(m, o) == m[1] < o[1] \/ (m[1] = o[1] /\ m[2] < o[2])

\* insert_follow_ups_in_tx: the follow-ups of batch members ms in one INSERT ... ON
\* CONFLICT DO NOTHING on idx_awa_jobs_unique. A key already held is skipped; of
\* several members offering a free key the first inserts it and the rest are skipped.
BatchInsert(ms) ==
    LET bufOf(m) == att[m[1]][m[2]].buf
        winners  == {m \in ms : /\ bufOf(m) # NoKey
                                /\ ~KeyHeld(rows, bufOf(m))
                                /\ \A o \in ms : (o # m /\ bufOf(o) = bufOf(m)) => Precedes(m, o)}
    IN  rows \cup {[job |-> w[1], attempt |-> w[2], key |-> bufOf(w)] : w \in winners}

\* A try of finalize_with_retry failed as far as the finalizer knows: it tries
\* again while tries remain, otherwise it gives up and the job waits for rescue.
\* The correct finalizer borrows the sealed follow-ups for each try; the
\* DrainOnFirstAttempt finalizer takes them on the first.
AfterFailedTry(a) ==
    IF a.tries + 1 < MaxFinalizeTries
        THEN [a EXCEPT !.tries = @ + 1,
                       !.buf   = IF Variant = "DrainOnFirstAttempt" THEN NoKey ELSE @]
        ELSE Done

---------------------------------------------------------------------------------------
(* Actions *)

\* The dispatcher claims an available job under a new run lease.
Claim(j) ==
    /\ jobState[j] = "available"
    /\ lease[j] < MaxAttempts
    /\ jobState' = [jobState EXCEPT ![j] = "running"]
    /\ lease' = [lease EXCEPT ![j] = @ + 1]
    /\ att' = [att EXCEPT ![j][lease[j] + 1] = Fresh]
    /\ UNCHANGED <<rows, commits>>

\* The running handler computes key k and stages B for it. A stale handler (rescued,
\* superseded or completed externally) keeps running and may still stage.
\* InsertBeforeCompletion: the handler inserts B itself and stages nothing.
Stage(j, l, k) ==
    /\ att[j][l].phase = "running"
    /\ att[j][l].staged = NoKey
    /\ IF Variant = "InsertBeforeCompletion"
          THEN /\ rows' = InsertFollowUp(j, l, k)
               /\ UNCHANGED att
          ELSE /\ att' = [att EXCEPT ![j][l].staged = k]
               /\ UNCHANGED rows
    /\ UNCHANGED <<jobState, lease, commits>>

\* The handler returns Completed: the executor seals the buffer and the completer
\* picks the path. A job that staged nothing is batched; one that staged is batched
\* with BatchFollowUps and takes the per-job transaction without it (BatchedPath:
\* batched either way).
Seal(j, l) ==
    LET a     == att[j][l]
        route == IF a.staged # NoKey /\ ~BatchFollowUps /\ Variant # "BatchedPath"
                     THEN "perjob" ELSE "batched"
    IN  /\ a.phase = "running"
        /\ att' = [att EXCEPT ![j][l] = [a EXCEPT !.phase = "finalizing",
                                                  !.buf   = a.staged,
                                                  !.route = route]]
        /\ UNCHANGED <<jobState, lease, rows, commits>>

\* finalize_in_tx matches its row and commits the completion together with the
\* staged inserts. With ackLost the commit lands but the finalizer sees an error
\* and tries again. InsertAfterCompletion: the transaction inserts nothing and
\* the insert is left to a second transaction.
FinalizeCommit(j, l, ackLost) ==
    LET a     == att[j][l]
        after == IF Variant = "InsertAfterCompletion" THEN rows ELSE InsertFollowUp(j, l, a.buf)
    IN
    /\ a.phase = "finalizing"
    /\ a.route = "perjob"
    /\ Guard(j, l)
    /\ jobState' = [jobState EXCEPT ![j] = "completed"]
    /\ rows' = after
    /\ commits' = commits \cup {CommitRecord(j, l, after)}
    /\ att' = [att EXCEPT ![j][l] =
                  IF ackLost THEN AfterFailedTry(a)
                  ELSE IF Variant = "InsertAfterCompletion"
                           THEN [a EXCEPT !.phase = "inserting"]
                           ELSE Done]
    /\ UNCHANGED lease

\* The completion transaction aborts before it commits (deadlock, lost connection):
\* nothing changes in the database and the finalizer tries again. On the batched
\* path a batch's abort is each member's try failing; a member with nothing to
\* insert is left out (its retries matter to no invariant, as for a plain batch).
FinalizeAbort(j, l) ==
    LET a == att[j][l] IN
    /\ a.phase = "finalizing"
    /\ a.route = "perjob" \/ (BatchFollowUps /\ a.buf # NoKey)
    /\ att' = [att EXCEPT ![j][l] = AfterFailedTry(a)]
    /\ UNCHANGED <<jobState, lease, rows, commits>>

\* The guard matches no row (rescued, superseded, completed externally, or a
\* replay after a lost acknowledgement): the transaction rolls back and the
\* attempt's follow-ups are dropped. Either path.
FinalizeStale(j, l) ==
    /\ att[j][l].phase = "finalizing"
    /\ ~Guard(j, l)
    /\ att' = [att EXCEPT ![j][l] = Done]
    /\ UNCHANGED <<jobState, lease, rows, commits>>

\* complete_batch: plain lease-guarded completion, many jobs per statement, no inserts;
\* the completer uses it only for a batch with nothing to insert (BatchedPath: also
\* for a job that staged).
CompleteBatched(j, l) ==
    /\ att[j][l].phase = "finalizing"
    /\ att[j][l].route = "batched"
    /\ Variant = "BatchedPath" \/ att[j][l].buf = NoKey
    /\ Guard(j, l)
    /\ jobState' = [jobState EXCEPT ![j] = "completed"]
    /\ commits' = commits \cup {CommitRecord(j, l, rows)}
    /\ att' = [att EXCEPT ![j][l] = Done]
    /\ UNCHANGED <<lease, rows>>

\* complete_batch_with_follow_ups: one transaction for the batch B (a set of
\* <<job, attempt>> members on the batched route with something to insert). The
\* engine's batches also carry plain completions; a plain member's part is exactly
\* CompleteBatched's (it inserts nothing, and its guard and row are its own), so it
\* is left to that action here, which keeps the state space small. The guarded UPDATE completes every member whose guard matches; the INSERT
\* then carries exactly those members' follow-ups (BatchInsertsUnmatched: every
\* member's). Members that matched nothing are stale and are dropped. With ackLost the
\* commit lands but the finalizer sees an error, and every member tries again.
CompleteBatchedWithFollowUps(B, ackLost) ==
    LET matched   == {m \in B : Guard(m[1], m[2])}
        inserting == IF Variant = "BatchInsertsUnmatched" THEN B ELSE matched
        after     == BatchInsert(inserting)
    IN
    /\ BatchFollowUps
    /\ B # {}
    /\ \A m \in B : /\ att[m[1]][m[2]].phase = "finalizing"
                   /\ att[m[1]][m[2]].route = "batched"
                   /\ att[m[1]][m[2]].buf # NoKey
    /\ jobState' = [j \in Jobs |-> IF \E m \in matched : m[1] = j THEN "completed" ELSE jobState[j]]
    /\ rows' = after
    /\ commits' = commits \cup {CommitRecord(m[1], m[2], after) : m \in matched}
    /\ att' = [j \in Jobs |-> [l \in Attempts |->
                  IF <<j, l>> \in B
                      THEN IF ackLost THEN AfterFailedTry(att[j][l]) ELSE Done
                      ELSE att[j][l]]]
    /\ UNCHANGED lease

\* A batch with follow-ups failed in a way its retries cannot fix (a non-duplicate
\* insert error) or passed the finalize deadline: nothing of it committed that the
\* lease guard would not replay as stale, and each member is finalized alone.
FallBackToPerJob(j, l) ==
    /\ BatchFollowUps
    /\ att[j][l].phase = "finalizing"
    /\ att[j][l].route = "batched"
    /\ att[j][l].buf # NoKey    \* a plain member's fallback is CompleteBatched's effect
    /\ att' = [att EXCEPT ![j][l] = [@ EXCEPT !.route = "perjob", !.tries = 0]]
    /\ UNCHANGED <<jobState, lease, rows, commits>>

\* InsertAfterCompletion only: the separate transaction that inserts B after the
\* completion committed. A crash before it runs is the attempt never taking it.
InsertAfterCommit(j, l) ==
    /\ att[j][l].phase = "inserting"
    /\ rows' = InsertFollowUp(j, l, att[j][l].buf)
    /\ att' = [att EXCEPT ![j][l] = Done]
    /\ UNCHANGED <<jobState, lease, commits>>

\* rescue_stale: a stale heartbeat or an expired deadline. The job is retryable
\* while attempts remain, failed otherwise. The handler is not stopped.
Rescue(j) ==
    /\ jobState[j] = "running"
    /\ jobState' = [jobState EXCEPT ![j] = IF lease[j] < MaxAttempts THEN "available" ELSE "failed"]
    /\ UNCHANGED <<lease, att, rows, commits>>

\* Client::complete_external completes the job from a process with no handler
\* context: registered specs could fire there, staged follow-ups cannot.
CompleteExternal(j) ==
    /\ jobState[j] = "running"
    /\ jobState' = [jobState EXCEPT ![j] = "completed"]
    /\ UNCHANGED <<lease, att, rows, commits>>

\* B row r releases its key: a completed B is pruned, or B moves to a state outside
\* its UniqueOpts::states. Another insert of the key can then succeed.
ReleaseKey(r) ==
    /\ r \in rows
    /\ rows' = rows \ {r}
    /\ UNCHANGED <<jobState, lease, att, commits>>

\* Nothing is left to do: stutter instead of deadlocking.
Quiescent ==
    /\ \A j \in Jobs : jobState[j] \in {"completed", "failed"}
    /\ \A j \in Jobs, l \in Attempts : att[j][l].phase \in {"idle", "done"}
    /\ UNCHANGED vars

---------------------------------------------------------------------------------------

Init ==
    /\ jobState = [j \in Jobs |-> "available"]
    /\ lease = [j \in Jobs |-> 0]
    /\ att = [j \in Jobs |-> [l \in Attempts |-> Idle]]
    /\ rows = {}
    /\ commits = {}

Next ==
    \/ \E j \in Jobs :
          \/ Claim(j)
          \/ Rescue(j)
          \/ CompleteExternal(j)
    \/ \E j \in Jobs, l \in Attempts :
          \/ \E k \in Keys : Stage(j, l, k)
          \/ Seal(j, l)
          \/ \E ackLost \in BOOLEAN : FinalizeCommit(j, l, ackLost)
          \/ FinalizeAbort(j, l)
          \/ FinalizeStale(j, l)
          \/ CompleteBatched(j, l)
          \/ FallBackToPerJob(j, l)
          \/ InsertAfterCommit(j, l)
    \/ \E B \in SUBSET (Jobs \X Attempts), ackLost \in BOOLEAN :
          CompleteBatchedWithFollowUps(B, ackLost)
    \/ \E r \in rows : ReleaseKey(r)
    \/ Quiescent

Spec == Init /\ [][Next]_vars

---------------------------------------------------------------------------------------
(* Invariants *)

\* Every follow-up row traces to a committed handler completion of the attempt that
\* staged it.
FollowUpTracesToCommit ==
    \A r \in rows :
        \E c \in commits : c.job = r.job /\ c.attempt = r.attempt /\ c.key = r.key

\* At most one row per key among the rows whose state holds the key.
AtMostOneRowPerKey ==
    \A k \in Keys : Cardinality({r \in rows : r.key = k}) <= 1

\* Every committed completion that staged a key committed with its follow-up or with
\* an existing row holding the key: once it had committed, a row held the key.
CompletionHasFollowUp ==
    \A c \in commits : c.key # NoKey => c.keyHeld

\* Only the current lease completes a job: every handler completion committed while
\* its row was running under that attempt's lease.
OnlyCurrentLeaseCompletes ==
    \A c \in commits : c.current

---------------------------------------------------------------------------------------
(* Witnesses: states the correct protocol must be able to reach, so that the         *)
(* invariants are not passing vacuously. The twin checks each as a "sometimes"       *)
(* property; in TLC, check ~W as an invariant and expect a violation.                *)

\* A completion committed with its key already held, so its insert was skipped.
WitnessDedupSkip == \E c \in commits : c.key # NoKey /\ c.keyHeld /\ ~c.inserted

\* Two completions inserted a row for the same key: the first row released it.
WitnessKeyReinserted ==
    \E c1, c2 \in commits : c1 # c2 /\ c1.inserted /\ c2.inserted /\ c1.key = c2.key

\* A commit whose acknowledgement was lost is about to be replayed.
WitnessLostAckReplay ==
    \E j \in Jobs, l \in Attempts :
        /\ att[j][l].phase = "finalizing"
        /\ att[j][l].tries > 0
        /\ \E c \in commits : c.job = j /\ c.attempt = l

\* A retry after an abort is about to commit under the current lease.
WitnessRetryAfterAbort ==
    \E j \in Jobs, l \in Attempts :
        /\ att[j][l].phase = "finalizing"
        /\ att[j][l].tries > 0
        /\ att[j][l].staged # NoKey
        /\ jobState[j] = "running"
        /\ lease[j] = l

\* A superseded attempt that staged a key is finalizing.
WitnessSupersededFinalizing ==
    \E j \in Jobs, l \in Attempts :
        /\ att[j][l].phase = "finalizing"
        /\ att[j][l].staged # NoKey
        /\ lease[j] > l

\* A batched completion that inserted its follow-up lost its acknowledgement and
\* is about to be replayed.
WitnessBatchedReplay ==
    \E j \in Jobs, l \in Attempts :
        /\ att[j][l].phase = "finalizing"
        /\ att[j][l].route = "batched"
        /\ att[j][l].tries > 0
        /\ \E c \in commits : c.job = j /\ c.attempt = l /\ c.inserted

\* A job was completed externally under an attempt that had staged a key.
WitnessExternalDiscard ==
    \E j \in Jobs :
        /\ jobState[j] = "completed"
        /\ \A c \in commits : c.job # j
        /\ \E l \in Attempts : att[j][l].staged # NoKey

=======================================================================================
