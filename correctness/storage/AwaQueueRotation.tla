------------------------------- MODULE AwaQueueRotation -------------------------------
(***************************************************************************************)
(* Queue-storage rotation: one queue lane of the rotating storage engine.             *)
(*                                                                                     *)
(* Ready entries live in a ring of QueueSlots partitions. qcur is the slot new        *)
(* entries go to and qgen[s] is slot s's generation. Entries are append-only records  *)
(* [job, slot, gen, seq, k]: k is the run lease the next claim will use. An entry is  *)
(* never modified; that it was consumed is recorded in the separate set consumed,    *)
(* keyed by the entry's seq (seqs are never reused). The implementation records it    *)
(* with the cursor and the set marked (the claimed_entries rows): an entry is         *)
(* available to every reader (Avail) when it is unmarked and at or above the cursor,  *)
(* so no mark is kept below the cursor (AdvanceCursor drops them; the claim writes    *)
(* none there). Claims and reclaims read Avail; AvailIsUnconsumed checks that it      *)
(* always agrees with consumed. Open leases live in a ring of LeaseSlots partitions   *)
(* with lcur the slot new leases go to.                                                *)
(*                                                                                     *)
(*   - A producer takes the ring's lock in shared mode and reads the current slot     *)
(*     (ReadSlot: it holds qcur, no seq yet), then draws seq = nextSeq and appends    *)
(*     into the slot it read (BeginAppend), and later commits or aborts, releasing    *)
(*     the lock; pending appends can commit out of seq order (a late commit).         *)
(*   - Slot pruning: seal[s] is Open while s is current; the rotation away from s     *)
(*     sets it to nextSeq (every entry of s has a lower seq), a truncate to 0 (read   *)
(*     by no claim). A claim opens only the eligible slots: Open, or sealed above     *)
(*     the cursor. The seal is final because the rotation takes the ring's lock       *)
(*     exclusively: no producer that read the closing slot is still running.          *)
(*   - The lane's cursor is a seq: Claim takes the lowest-seq committed, available    *)
(*     entry in an eligible slot, marks it and opens a lease that references          *)
(*     the entry (slot, gen, seq). AdvanceCursor moves the cursor to the stable       *)
(*     point of what a claim sees: never past a pending append, never past an         *)
(*     available committed entry of an eligible slot. (The implementation derives     *)
(*     the stable point from xids; the model uses pending. AwaStablePoint.tla models  *)
(*     that derivation.)                                                              *)
(*   - Complete deletes the open lease and writes a narrow receipt into the slot of   *)
(*     the lease's entry. Retry and Rescue delete it and move the job to the plain    *)
(*     deferred table under lease k + 1 (failed once attempts run out); Promote       *)
(*     appends a deferred job to qcur. A rescued worker keeps running as a zombie;    *)
(*     its completion finds no open lease row and does nothing (the lease guard).     *)
(*   - RotateQueue / RotateLease move qcur / lcur to the next slot once it is empty;  *)
(*     RotateQueue also waits for the ring's lock (no slot reader, no pending         *)
(*     append) and seals the slot it leaves.                                          *)
(*   - ReclaimQueue(s) is one transaction holding TRUNCATE's ACCESS EXCLUSIVE lock:   *)
(*     it waits for producers appending into s, carries the available entries and     *)
(*     the entries of running jobs (moving their lease's entry reference) forward to  *)
(*     qcur under new seqs, drops the rest (resolved entries, receipts: history is    *)
(*     pruned), empties s, seals it at 0 and bumps qgen[s]. Its carry-forward holds   *)
(*     the ring's lock shared and is one step. One stuck slot cannot freeze the ring. *)
(*   - ReclaimLease(ls) truncates a lease slot that holds no open lease. Leases are   *)
(*     never moved between lease slots.                                               *)
(*                                                                                     *)
(* Variant selects the correct protocol or one of six seeded bugs; each negative      *)
(* .cfg names the one invariant it is expected to violate. The executable twin in     *)
(* correctness/src/queue_rotation.rs has the same state, action names and invariants  *)
(* and is what CI checks; keep the two in step.                                       *)
(*                                                                                     *)
(* Abstractions and bounds:                                                            *)
(*   - one lane (one queue, one priority); the lanes of a queue share the ring and    *)
(*     nothing here depends on how many there are.                                     *)
(*   - seqs are bounded by MaxSeq: an action that needs a seq it cannot draw is       *)
(*     disabled, and Quiescent may stutter once this bound stops the next step (a     *)
(*     bound of the search, like a TLC state constraint, not of the engine).          *)
(*   - RotateQueue / RotateLease leave only a slot that holds something (see there).  *)
(*   - a lease slot holds open leases and the dead rows of closed ones; ldirty is     *)
(*     the set of lease slots written since their last truncate, and "empty" means    *)
(*     not in ldirty.                                                                  *)
(*   - Open is a model value (the SQL's NULL seal_seq): a seal is Open or a seq       *)
(*     bound in 0..MaxSeq (the SQL stores the last seq drawn, bound - 1; a truncated  *)
(*     slot's -1 is 0 here).                                                          *)
(*   - the ghosts inserted, done, claimed, dupClaim, staleCompletion and events are   *)
(*     observations only; no guard reads them.                                        *)
(***************************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Jobs,        \* the jobs, e.g. {1, 2}
    QueueSlots,  \* number of queue-storage partitions in the ring
    LeaseSlots,  \* number of lease partitions in the ring
    MaxAttempts, \* max_attempts of each job: run leases 1..MaxAttempts
    MaxSeq,      \* seqs 0..MaxSeq-1 can be drawn (bound of the search)
    Variant,     \* "Correct" or one of the seeded bugs in Variants
    Open         \* a model value: the seal of the current slot (no bound yet)

Variants ==
    { "Correct",
      "ReclaimWithoutCarryForward", \* reclaim drops the unconsumed entries of the slot
      "ReclaimUnderOpenLease",      \* reclaim drops running jobs' entries; lease refs dangle
      "CarryForwardInTwoSteps",     \* copy forward in one step, truncate in a later one
      "CursorSkipsPending",         \* AdvanceCursor ignores pending appends
      "CompleteWithoutLeaseGuard",  \* a completion deletes the job's open lease, any k
      "SealWithoutRingLock" }       \* RotateQueue seals qcur without the ring's lock

ASSUME
    /\ Jobs # {}
    /\ QueueSlots \in Nat \ {0, 1}
    /\ LeaseSlots \in Nat \ {0, 1}
    /\ MaxAttempts \in Nat \ {0}
    /\ MaxSeq \in Nat \ {0}
    /\ Variant \in Variants
    /\ Open \notin Nat

QSlots  == 0..QueueSlots - 1
LSlots  == 0..LeaseSlots - 1
Seqs    == 0..MaxSeq - 1
Leases  == 1..MaxAttempts
Seals   == (0..MaxSeq) \cup {Open}
Events  == {"carryUnconsumed", "carryRunning", "lateClaim", "zombieRejected", "leaseReclaimed",
            "prunedClaim", "markDropped"}

VARIABLES
    qcur,      \* the queue slot new entries go to
    qgen,      \* qgen[s]: generation of queue slot s, bumped by each reclaim
    seal,      \* seal[s]: Open while s is current, else every entry of s has seq < seal[s]
    lcur,      \* the lease slot new leases go to
    ldirty,    \* lease slots written since their last truncate
    nextSeq,   \* the next seq to draw
    cursor,    \* the lane's claim cursor (a seq)
    readers,   \* producers holding the ring's lock that read the current slot: [job, slot, gen]
    pending,   \* begun, uncommitted appends: [job, slot, gen, seq, k]
    entries,   \* committed ready entries: [job, slot, gen, seq, k]; never modified
    consumed,  \* seqs of the entries a claim has consumed
    marked,    \* the consumed seqs the implementation marks: none below the cursor
    leases,    \* open leases: [job, k, lslot, slot, gen, seq] (the last three: entry ref)
    receipts,  \* terminal receipts in the queue slot of their entry: [job, k, slot, outcome]
    deferred,  \* the plain deferred table: [job, k]
    zombies,   \* rescued workers still running: [job, k]
    moving,    \* CarryForwardInTwoSteps only: slots copied forward but not yet truncated
    inserted,  \* ghost: jobs whose append committed at least once
    done,      \* ghost: jobs that reached a terminal state (completed or failed)
    claimed,   \* ghost: the <<job, k>> pairs claimed so far
    dupClaim,  \* ghost: a Claim found its pair already in claimed
    staleCompletion, \* ghost: a terminal transition came from a lease that was not open
    events     \* ghost: which witnessed events have happened (Events)

vars == <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, readers, pending, entries,
          consumed, marked, leases, receipts, deferred, zombies, moving, inserted, done, claimed,
          dupClaim, staleCompletion, events>>

EntryRec   == [job : Jobs, slot : QSlots, gen : Nat, seq : Seqs, k : Leases]
LeaseRec   == [job : Jobs, k : Leases, lslot : LSlots, slot : QSlots, gen : Nat, seq : Seqs]
ReceiptRec == [job : Jobs, k : Leases, slot : QSlots, outcome : {"completed", "failed"}]
JobLease   == [job : Jobs, k : Leases]
ReaderRec  == [job : Jobs, slot : QSlots, gen : Nat]

TypeOK ==
    /\ qcur \in QSlots
    /\ qgen \in [QSlots -> Nat]
    /\ seal \in [QSlots -> Seals]
    /\ lcur \in LSlots
    /\ ldirty \subseteq LSlots
    /\ nextSeq \in 0..MaxSeq
    /\ cursor \in 0..MaxSeq
    /\ readers \subseteq ReaderRec
    /\ pending \subseteq EntryRec
    /\ entries \subseteq EntryRec
    /\ consumed \subseteq Seqs
    /\ marked \subseteq Seqs
    /\ leases \subseteq LeaseRec
    /\ receipts \subseteq ReceiptRec
    /\ deferred \subseteq JobLease
    /\ zombies \subseteq JobLease
    /\ moving \subseteq QSlots
    /\ inserted \subseteq Jobs
    /\ done \subseteq Jobs
    /\ claimed \subseteq Jobs \X Leases
    /\ dupClaim \in BOOLEAN
    /\ staleCompletion \in BOOLEAN
    /\ events \subseteq Events

---------------------------------------------------------------------------------------
(* Helpers *)

Min(S) == CHOOSE x \in S : \A y \in S : x <= y

Unconsumed(e) == e.seq \notin consumed

\* What the implementation reads as available: not marked, and at or above the cursor.
Avail(e) == e.seq \notin marked /\ e.seq >= cursor

\* The lease whose entry reference is e (a running job's entry).
RefersTo(l, e) == l.slot = e.slot /\ l.gen = e.gen /\ l.seq = e.seq

\* Queue slot s holds nothing: no entry, no receipt, no pending append.
QSlotEmpty(s) ==
    /\ \A e \in entries : e.slot # s
    /\ \A r \in receipts : r.slot # s
    /\ \A p \in pending : p.slot # s

\* Slot pruning: a claim opens queue slot s only if s can hold an entry at or past
\* the cursor: s is current (Open) or sealed above the cursor. A truncated slot
\* (sealed at 0) is never opened.
Eligible(s) == seal[s] = Open \/ seal[s] > cursor

\* No producer holds the ring's lock: none has read the current slot (readers) or
\* has an append in flight (pending). A rotation takes the lock exclusively.
RingLockFree == readers = {} /\ pending = {}

\* The stable point: the cursor may advance up to it. Never past a pending append
\* (CursorSkipsPending: ignores them) nor past an available committed entry that a
\* claim sees: the entries of slots a claim does not open are not looked at.
StablePoint ==
    Min({nextSeq}
        \cup {e.seq : e \in {x \in entries : Avail(x) /\ Eligible(x.slot)}}
        \cup (IF Variant = "CursorSkipsPending" THEN {} ELSE {p.seq : p \in pending}))

\* The entries of slot s that a reclaim carries forward: the available ones
\* (ReclaimWithoutCarryForward: none) and the others whose lease is still open
\* (ReclaimUnderOpenLease: none).
CarryUnconsumed(s) ==
    IF Variant = "ReclaimWithoutCarryForward" THEN {}
    ELSE {e \in entries : e.slot = s /\ Avail(e)}
CarryRunning(s) ==
    IF Variant = "ReclaimUnderOpenLease" THEN {}
    ELSE {e \in entries : e.slot = s /\ ~Avail(e) /\ \E l \in leases : RefersTo(l, e)}

\* The new seq of carried entry e among carried entries C: in seq order from nextSeq.
NewSeq(e, C) == nextSeq + Cardinality({x \in C : x.seq < e.seq})
Copy(e, C)   == [e EXCEPT !.slot = qcur, !.gen = qgen[qcur], !.seq = NewSeq(e, C)]

\* The leases after carrying C forward: a running job's lease refers to its copy.
MovedLeases(C) ==
    {IF \E e \in C : RefersTo(l, e)
         THEN LET e == CHOOSE x \in C : RefersTo(l, x)
              IN  [l EXCEPT !.slot = qcur, !.gen = qgen[qcur], !.seq = NewSeq(e, C)]
         ELSE l : l \in leases}

\* The events a carry of C records.
CarryEvents(C) ==
    events
    \cup (IF \E e \in C : Avail(e) THEN {"carryUnconsumed"} ELSE {})
    \cup (IF \E e \in C : ~Avail(e) THEN {"carryRunning"} ELSE {})

\* TRUNCATE of slot s, given the entries ents, consumed seqs cons and marks mks: the
\* slot's entries (with their marks) and receipts are gone, its generation moves on
\* and its seal is 0 (empty: no claim opens it).
Truncate(s, ents, cons, mks) ==
    LET kept == {e \in ents : e.slot # s} IN
    /\ entries' = kept
    /\ consumed' = {c \in cons : \E e \in kept : e.seq = c}
    /\ marked' = {c \in mks : \E e \in kept : e.seq = c}
    /\ receipts' = {r \in receipts : r.slot # s}
    /\ qgen' = [qgen EXCEPT ![s] = @ + 1]
    /\ seal' = [seal EXCEPT ![s] = 0]

\* The terminal transition of open lease l: the lease row is deleted and a receipt
\* written into the queue slot of its entry.
Finish(l, outcome) ==
    /\ leases' = leases \ {l}
    /\ receipts' = receipts \cup {[job |-> l.job, k |-> l.k, slot |-> l.slot,
                                   outcome |-> outcome]}
    /\ done' = done \cup {l.job}

\* The lease row a completion for <<z.job, z.k>> deletes: exactly its own
\* (CompleteWithoutLeaseGuard: any open lease of the job).
GuardMatches(l, z) ==
    /\ l.job = z.job
    /\ (Variant = "CompleteWithoutLeaseGuard" \/ l.k = z.k)

---------------------------------------------------------------------------------------
(* Actions *)

\* A producer begins inserting job j (not inserted yet, no append of it in flight):
\* it takes the ring's lock in shared mode and reads the current slot and its
\* generation (qs_current_slot). It holds the lock until it commits or aborts.
ReadSlot(j) ==
    /\ j \notin inserted
    /\ \A r \in readers : r.job # j
    /\ \A p \in pending : p.job # j
    /\ nextSeq < MaxSeq
    /\ readers' = readers \cup {[job |-> j, slot |-> qcur, gen |-> qgen[qcur]]}
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, pending, entries,
                   consumed, marked, leases, receipts, deferred, zombies, moving, inserted, done,
                   claimed, dupClaim, staleCompletion, events>>

\* The producer that read slot r.slot draws a seq and writes into that slot,
\* uncommitted. Under the ring's lock that slot is still the current one
\* (SealWithoutRingLock: it may have been sealed, or reclaimed, since).
BeginAppend(r) ==
    /\ r \in readers
    /\ nextSeq < MaxSeq
    /\ readers' = readers \ {r}
    /\ pending' = pending \cup {[job |-> r.job, slot |-> r.slot, gen |-> r.gen,
                                 seq |-> nextSeq, k |-> 1]}
    /\ nextSeq' = nextSeq + 1
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, cursor, entries, consumed, marked, leases,
                   receipts, deferred, zombies, moving, inserted, done, claimed, dupClaim,
                   staleCompletion, events>>

\* The producer commits: the entry becomes visible. Its slot cannot have been
\* reclaimed meanwhile (TRUNCATE waits for the producer's lock), which the
\* generation check states.
CommitAppend(p) ==
    /\ p \in pending
    /\ qgen[p.slot] = p.gen
    /\ pending' = pending \ {p}
    /\ entries' = entries \cup {p}
    /\ inserted' = inserted \cup {p.job}
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, readers, consumed, marked,
                   leases, receipts, deferred, zombies, moving, done, claimed, dupClaim,
                   staleCompletion, events>>

\* The producer rolls back: the job is not inserted (it may be begun again).
AbortAppend(p) ==
    /\ p \in pending
    /\ pending' = pending \ {p}
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, readers, entries,
                   consumed, marked, leases, receipts, deferred, zombies, moving, inserted, done,
                   claimed, dupClaim, staleCompletion, events>>

\* The lane claims its lowest-seq committed, available entry (at or above the cursor)
\* in the slots it opens (Eligible): the entry is marked consumed and a lease opened
\* in the current lease slot. "prunedClaim": a slot holding entries was not opened.
Claim ==
    LET ready == {e \in entries : Avail(e) /\ Eligible(e.slot)}
        e     == CHOOSE x \in ready : \A y \in ready : x.seq <= y.seq
        late  == IF \E c \in consumed : c > e.seq THEN {"lateClaim"} ELSE {}
        pruned == IF \E s \in QSlots : ~Eligible(s) /\ \E x \in entries : x.slot = s
                     THEN {"prunedClaim"} ELSE {}
    IN  /\ ready # {}
        /\ consumed' = consumed \cup {e.seq}
        /\ marked' = marked \cup {e.seq}
        /\ leases' = leases \cup {[job |-> e.job, k |-> e.k, lslot |-> lcur,
                                   slot |-> e.slot, gen |-> e.gen, seq |-> e.seq]}
        /\ ldirty' = ldirty \cup {lcur}
        /\ claimed' = claimed \cup {<<e.job, e.k>>}
        /\ dupClaim' = (dupClaim \/ <<e.job, e.k>> \in claimed)
        /\ events' = events \cup late \cup pruned
        /\ UNCHANGED <<qcur, qgen, seal, lcur, nextSeq, cursor, readers, pending, entries,
                       receipts, deferred, zombies, moving, inserted, done, staleCompletion>>

\* The cursor moves forward to the stable point, and the marks below it go: the cursor
\* consumes what lies below it. (The implementation's claim writes no mark for what it
\* takes below the cursor it leaves, and keeps the marks written earlier, which no
\* reader asks about; dropping them all is the stronger case.)
AdvanceCursor ==
    /\ StablePoint > cursor
    /\ cursor' = StablePoint
    /\ marked' = {m \in marked : m >= StablePoint}
    /\ events' = IF \E m \in marked : m < StablePoint THEN events \cup {"markDropped"}
                 ELSE events
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, readers, pending, entries,
                   consumed, leases, receipts, deferred, zombies, moving, inserted, done,
                   claimed, dupClaim, staleCompletion>>

\* The worker holding open lease l completes the job.
Complete(l) ==
    /\ l \in leases
    /\ Finish(l, "completed")
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, readers, pending,
                   entries, consumed, marked, deferred, zombies, moving, inserted, claimed, dupClaim,
                   staleCompletion, events>>

\* Open lease l ends without completing (an error, a retry, or rescue of a dead
\* worker): the job is deferred under the next lease, or fails once attempts run out.
EndAttempt(l) ==
    IF l.k < MaxAttempts
        THEN /\ leases' = leases \ {l}
             /\ deferred' = deferred \cup {[job |-> l.job, k |-> l.k + 1]}
             /\ UNCHANGED <<receipts, done>>
        ELSE /\ Finish(l, "failed")
             /\ UNCHANGED deferred

\* The handler fails or asks for a retry.
Retry(l) ==
    /\ l \in leases
    /\ EndAttempt(l)
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, readers, pending,
                   entries, consumed, marked, zombies, moving, inserted, claimed, dupClaim,
                   staleCompletion, events>>

\* Maintenance rescues a lease whose worker looks dead; the worker keeps running.
Rescue(l) ==
    /\ l \in leases
    /\ EndAttempt(l)
    /\ zombies' = zombies \cup {[job |-> l.job, k |-> l.k]}
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, readers, pending,
                   entries, consumed, marked, moving, inserted, claimed, dupClaim, staleCompletion,
                   events>>

\* A rescued worker finishes and tries to complete under its old lease. The
\* completion deletes the lease row its guard matches; with none it is stale and
\* does nothing.
ZombieComplete(z) ==
    /\ z \in zombies
    /\ zombies' = zombies \ {z}
    /\ IF \E l \in leases : GuardMatches(l, z)
          THEN \E l \in leases :
                  /\ GuardMatches(l, z)
                  /\ Finish(l, "completed")
                  /\ staleCompletion' =
                        (staleCompletion \/ ~\E o \in leases : o.job = z.job /\ o.k = z.k)
                  /\ UNCHANGED events
          ELSE /\ events' = events \cup {"zombieRejected"}
               /\ UNCHANGED <<leases, receipts, done, staleCompletion>>
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, nextSeq, cursor, readers, pending,
                   entries, consumed, marked, deferred, moving, inserted, claimed, dupClaim>>

\* A deferred job becomes ready again: appended (committed) to the current slot in
\* one step (its transaction holds the ring's lock shared from reading qcur to its
\* commit, so no rotation falls in between).
Promote(d) ==
    /\ d \in deferred
    /\ nextSeq < MaxSeq
    /\ deferred' = deferred \ {d}
    /\ entries' = entries \cup {[job |-> d.job, slot |-> qcur, gen |-> qgen[qcur],
                                 seq |-> nextSeq, k |-> d.k]}
    /\ nextSeq' = nextSeq + 1
    /\ UNCHANGED <<qcur, qgen, seal, lcur, ldirty, cursor, readers, pending, consumed, marked,
                   leases, receipts, zombies, moving, inserted, done, claimed, dupClaim,
                   staleCompletion, events>>

\* New entries go to the next queue slot once it is empty. The current slot must
\* hold something: rotating away from an empty slot only renames it (the engine
\* rotates a slot once it has filled or aged), and leaving it out keeps the search
\* small. The rotation takes the ring's lock exclusively, so it waits until no
\* producer has read the current slot and not yet ended (SealWithoutRingLock: it
\* does not wait). Then every seq of the slot it leaves was drawn: it seals that
\* slot at nextSeq and opens the next one.
RotateQueue ==
    LET next == (qcur + 1) % QueueSlots IN
    /\ ~QSlotEmpty(qcur)
    /\ QSlotEmpty(next)
    /\ Variant = "SealWithoutRingLock" \/ RingLockFree
    /\ qcur' = next
    /\ seal' = [seal EXCEPT ![qcur] = nextSeq, ![next] = Open]
    /\ UNCHANGED <<qgen, lcur, ldirty, nextSeq, cursor, readers, pending, entries,
                   consumed, marked, leases, receipts, deferred, zombies, moving, inserted, done,
                   claimed, dupClaim, staleCompletion, events>>

\* New leases go to the next lease slot once it is empty (truncated). As for the
\* queue ring, the current lease slot must have been written.
RotateLease ==
    LET next == (lcur + 1) % LeaseSlots IN
    /\ lcur \in ldirty
    /\ next \notin ldirty
    /\ lcur' = next
    /\ UNCHANGED <<qcur, qgen, seal, ldirty, nextSeq, cursor, readers, pending, entries,
                   consumed, marked, leases, receipts, deferred, zombies, moving, inserted, done,
                   claimed, dupClaim, staleCompletion, events>>

\* Reclaim queue slot s (not the current one, holding something) in one transaction:
\* TRUNCATE's lock waits for any producer appending into s; the unconsumed entries
\* and the running jobs' entries are carried forward to qcur under new seqs (a
\* running job's copy consumed, its lease's entry reference moved to the copy), then
\* s is truncated (and sealed at 0). The carry-forward appends to qcur under the
\* ring's lock held shared, within this one step. CarryForwardInTwoSteps: this
\* transaction only copies forward and marks s moving; FinishReclaim truncates later.
ReclaimQueue(s) ==
    LET C      == CarryUnconsumed(s) \cup CarryRunning(s)
        copies == {Copy(e, C) : e \in C}
        cons   == consumed \cup {NewSeq(e, C) : e \in {x \in C : ~Unconsumed(x)}}
        mks    == marked \cup {NewSeq(e, C) : e \in {x \in C : ~Avail(x)}}
    IN
    /\ s # qcur
    /\ s \notin moving
    /\ ~QSlotEmpty(s)
    /\ \A p \in pending : p.slot # s
    /\ nextSeq + Cardinality(C) <= MaxSeq
    /\ nextSeq' = nextSeq + Cardinality(C)
    /\ leases' = MovedLeases(C)
    /\ events' = CarryEvents(C)
    /\ IF Variant = "CarryForwardInTwoSteps"
          THEN /\ entries' = entries \cup copies
               /\ consumed' = cons
               /\ marked' = mks
               /\ moving' = moving \cup {s}
               /\ UNCHANGED <<qgen, seal, receipts>>
          ELSE /\ Truncate(s, entries \cup copies, cons, mks)
               /\ UNCHANGED moving
    /\ UNCHANGED <<qcur, lcur, ldirty, cursor, readers, pending, deferred, zombies, inserted,
                   done, claimed, dupClaim, staleCompletion>>

\* CarryForwardInTwoSteps only: the later transaction that truncates a slot copied
\* forward, once no open lease refers into it (a claim may have taken an old copy).
FinishReclaim(s) ==
    /\ s \in moving
    /\ \A l \in leases : l.slot # s
    /\ moving' = moving \ {s}
    /\ Truncate(s, entries, consumed, marked)
    /\ UNCHANGED <<qcur, lcur, ldirty, nextSeq, cursor, readers, pending, leases, deferred,
                   zombies, inserted, done, claimed, dupClaim, staleCompletion, events>>

\* Truncate lease slot ls (not the current one) once no open lease is in it. The
\* TRUNCATE removes every row of the slot; under the guard no open lease is among
\* them, and the leases clause says what it would remove without it.
ReclaimLease(ls) ==
    /\ ls # lcur
    /\ ls \in ldirty
    /\ \A l \in leases : l.lslot # ls
    /\ ldirty' = ldirty \ {ls}
    /\ leases' = {l \in leases : l.lslot # ls}
    /\ events' = events \cup {"leaseReclaimed"}
    /\ UNCHANGED <<qcur, qgen, seal, lcur, nextSeq, cursor, readers, pending, entries,
                   consumed, marked, receipts, deferred, zombies, moving, inserted, done, claimed,
                   dupClaim, staleCompletion>>

\* Nothing is in flight (no producer that read the slot, pending append, unconsumed
\* entry, open lease or deferred job), or the search's bound on seqs stops the next step: the seqs are used up, or
\* a slot waits for a reclaim whose carry-forward needs more seqs than remain.
\* Stutter instead of deadlocking.
NothingInFlight ==
    /\ readers = {}
    /\ pending = {}
    /\ \A e \in entries : ~Unconsumed(e)
    /\ leases = {}
    /\ deferred = {}

SeqBoundReached ==
    \/ nextSeq = MaxSeq
    \/ \E s \in QSlots :
          /\ s # qcur
          /\ s \notin moving
          /\ ~QSlotEmpty(s)
          /\ nextSeq + Cardinality(CarryUnconsumed(s) \cup CarryRunning(s)) > MaxSeq

Quiescent ==
    /\ NothingInFlight \/ SeqBoundReached
    /\ UNCHANGED vars

---------------------------------------------------------------------------------------

Init ==
    /\ qcur = 0
    /\ qgen = [s \in QSlots |-> 0]
    /\ seal = [s \in QSlots |-> IF s = 0 THEN Open ELSE 0]
    /\ lcur = 0
    /\ ldirty = {}
    /\ nextSeq = 0
    /\ cursor = 0
    /\ readers = {}
    /\ pending = {}
    /\ entries = {}
    /\ consumed = {}
    /\ marked = {}
    /\ leases = {}
    /\ receipts = {}
    /\ deferred = {}
    /\ zombies = {}
    /\ moving = {}
    /\ inserted = {}
    /\ done = {}
    /\ claimed = {}
    /\ dupClaim = FALSE
    /\ staleCompletion = FALSE
    /\ events = {}

Next ==
    \/ \E j \in Jobs : ReadSlot(j)
    \/ \E r \in readers : BeginAppend(r)
    \/ \E p \in pending : CommitAppend(p) \/ AbortAppend(p)
    \/ Claim
    \/ AdvanceCursor
    \/ \E l \in leases : Complete(l) \/ Retry(l) \/ Rescue(l)
    \/ \E z \in zombies : ZombieComplete(z)
    \/ \E d \in deferred : Promote(d)
    \/ RotateQueue
    \/ RotateLease
    \/ \E s \in QSlots : ReclaimQueue(s) \/ FinishReclaim(s)
    \/ \E ls \in LSlots : ReclaimLease(ls)
    \/ Quiescent

Spec == Init /\ [][Next]_vars

---------------------------------------------------------------------------------------
(* Invariants *)

\* The places a job can be: an unconsumed committed entry, an open lease, the
\* deferred table, terminal.
InQueue(j)    == \E e \in entries : e.job = j /\ Unconsumed(e)
InLease(j)    == \E l \in leases : l.job = j
InDeferred(j) == \E d \in deferred : d.job = j

\* Every inserted job is somewhere: nothing is lost.
\*
\* The "at most one place" half of "exactly one place" is OnePlacePerJob below, a
\* separate invariant checked in the positive configuration. It is split off because
\* CarryForwardInTwoSteps holds two copies of one entry between its two steps (the
\* state whose consequence, a second claim, is OneClaimPerLease): with "exactly one"
\* here that bug would violate two invariants. Every other seeded bug keeps it.
NothingLost ==
    \A j \in inserted : InQueue(j) \/ InLease(j) \/ InDeferred(j) \/ j \in done

\* No <<job, k>> is claimed twice: each run lease runs at most once.
OneClaimPerLease == ~dupClaim

\* Every open lease references an entry that exists: a slot is never truncated
\* under an unresolved lease.
LeaseHasEntry ==
    \A l \in leases : \E e \in entries :
        RefersTo(l, e) /\ e.job = l.job /\ e.k = l.k

\* No committed, unconsumed entry lies below the cursor (it could never be claimed).
CursorNeverPassesWork ==
    \A e \in entries : Unconsumed(e) => e.seq >= cursor

\* Every terminal transition came from a lease that was open at that moment.
OnlyOpenLeaseCompletes == ~staleCompletion

\* Positive configuration only: what the implementation reads as available (unmarked,
\* at or above the cursor) is exactly what is unconsumed, so keeping no mark below the
\* cursor changes no claim, reclaim or reader. Every seeded bug that lets the cursor
\* pass work breaks it too, with CursorNeverPassesWork, the consequence named there.
AvailIsUnconsumed == \A e \in entries : Avail(e) <=> Unconsumed(e)

\* Positive configuration only: every inserted job is in exactly one place (at most
\* one entry, lease or deferred row, and not also terminal). See NothingLost.
OnePlacePerJob ==
    \A j \in inserted :
        Cardinality({e \in entries : e.job = j /\ Unconsumed(e)})
        + Cardinality({l \in leases : l.job = j})
        + Cardinality({d \in deferred : d.job = j})
        + (IF j \in done THEN 1 ELSE 0) = 1

\* Positive configuration only: the seals hold. The current slot is Open, and every
\* committed or pending entry of a sealed slot has a seq below its seal (a slot
\* sealed at 0 holds none). It is the lemma slot pruning rests on: with it, every
\* entry at or past the cursor is in a slot a claim opens. SealWithoutRingLock
\* breaks it first, and CursorNeverPassesWork, the consequence its configuration
\* names, once the cursor passes the seal; checking SealHolds there too would make
\* that seeded bug violate two invariants.
SealHolds ==
    /\ seal[qcur] = Open
    /\ \A e \in entries \cup pending : seal[e.slot] # Open => e.seq < seal[e.slot]

---------------------------------------------------------------------------------------
(* Witnesses: states the correct protocol must be able to reach, so that the         *)
(* invariants are not passing vacuously. The twin checks each as a "sometimes"       *)
(* property; in TLC, check ~W as an invariant and expect a violation.                *)

\* The ring wrapped: a slot was reclaimed and holds entries of its next generation.
WitnessRingWrapped == \E e \in entries : e.gen > 0

\* A reclaim carried an unconsumed entry forward.
WitnessCarryUnconsumed == "carryUnconsumed" \in events

\* A reclaim carried a running job's entry forward and moved its lease's reference.
WitnessCarryRunning == "carryRunning" \in events

\* A late commit below the highest claimed seq was claimed.
WitnessLateCommitClaimed == "lateClaim" \in events

\* A zombie's completion found no open lease row and was rejected.
WitnessZombieRejected == "zombieRejected" \in events

\* A lease slot was truncated.
WitnessLeaseSlotReclaimed == "leaseReclaimed" \in events

\* Slot pruning happened: a claim did not open a slot that held entries.
WitnessClaimPruned == "prunedClaim" \in events

\* The cursor passed a marked entry: it is consumed without its mark.
WitnessMarkDropped == "markDropped" \in events

=======================================================================================
