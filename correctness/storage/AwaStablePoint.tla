------------------------------- MODULE AwaStablePoint -------------------------------
(***************************************************************************************)
(* Queue storage's candidate stable point: how a lane's claim derives, from           *)
(* transaction ids alone, a seq below which every producer has ended.                 *)
(*                                                                                     *)
(* AwaQueueRotation abstracts this away (its stable point reads the pending appends   *)
(* directly), which is how session 20's horizon bug got past it. This module models   *)
(* the derivation in functions.sql (qs_claim, qs_claim_queue, qs_hold_xid):           *)
(*                                                                                     *)
(*   - A producer holds its transaction id (Hold: the hold_xid trigger) before it     *)
(*     draws a seq (Draw), then commits or rolls back. Xids and seqs are handed out   *)
(*     in increasing order; commits come in any order.                                *)
(*   - A claim of the lane, in order: ClaimBegin reads the last seq drawn (vseq)      *)
(*     while its transaction holds no xid; ClaimLane is the lane's work under the     *)
(*     lane's row lock, which assigns the claim its xid, in one snapshot: the        *)
(*     candidate (cand, candXmax) recorded by an earlier claim is confirmed once no   *)
(*     xid below candXmax runs (candXmax <= the snapshot's xmin); then stable moves   *)
(*     up to cand, and a new candidate is recorded: vseq, with the claim's own xid.   *)
(*     It takes the lowest committed unconsumed seq at or past the cursor (a claim   *)
(*     of one) and moves the cursor on, never past stable + 1. ClaimEnd commits.      *)
(*   - Claims of one lane take turns on its row lock: one claimer stands for all.     *)
(*                                                                                     *)
(* The argument: a producer of a seq at or below vseq drew it before the claim read   *)
(* vseq, and held its xid before that, so its xid is below the claim's; once every    *)
(* xid below the claim's has ended, so has every such producer.                       *)
(*                                                                                     *)
(* Seeded bugs (Variant):                                                             *)
(*   - HorizonFromSnapshotXmax: candXmax is the snapshot's xmax (one past the latest  *)
(*     completed xid), the code before session 20's fix. The newest producer, still   *)
(*     running, holds an xid at or above it.                                          *)
(*   - SeqReadAfterXid: the claim holds its xid before it reads vseq, so a producer   *)
(*     that starts in between draws a seq the candidate covers with a higher xid.     *)
(* Each violates CursorNeverPassesWork, the consequence; StableSettled, the lemma,    *)
(* is checked by the positive configuration only.                                     *)
(*                                                                                     *)
(* Bounds: each producer inserts once; xids 1..MaxXid (an action needing a new xid is *)
(* disabled past it, and Quiescent stutters then). Seqs start at 1 and 0 is "none"    *)
(* (the SQL's seqs start at 1 and a new lane's fields at 0). The executable twin is   *)
(* correctness/src/stable_point.rs; keep the two in step.                             *)
(***************************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Producers,  \* the producers, e.g. {1, 2}; each inserts one entry at most
    MaxXid,     \* xids 1..MaxXid can be assigned (bound of the search)
    Variant     \* "Correct" or one of the seeded bugs in Variants

Variants == {"Correct", "HorizonFromSnapshotXmax", "SeqReadAfterXid"}

ASSUME
    /\ Producers # {}
    /\ MaxXid \in Nat \ {0}
    /\ Variant \in Variants

Xids   == 0..MaxXid
NSeqs  == Cardinality(Producers)
Seqs   == 0..NSeqs
Phases == {"idle", "xid", "drawn", "done"}
CPhases == {"idle", "begun", "lane"}
Events == {"heldBack", "gapPassed", "lateClaim"}

VARIABLES
    nextXid,   \* the next xid to assign
    nextSeq,   \* the next seq to draw
    latest,    \* the latest completed xid (0: none): a snapshot's xmax is latest + 1
    prod,      \* prod[p]: producer p's transaction [phase, xid, seq] (0: none yet)
    entries,   \* committed seqs
    aborted,   \* seqs whose producer rolled back (gaps)
    consumed,  \* seqs a claim took
    cursor,    \* the lane's cursor: no claim looks below it
    stable,    \* the lane's stable point: every producer of a seq at or below it has ended
    cand,      \* the candidate stable point
    candXmax,  \* its horizon: confirmed once no xid below it runs
    claim,     \* the claimer's transaction [phase, vseq, xid]
    events     \* ghost: witnessed events (Events)

vars == <<nextXid, nextSeq, latest, prod, entries, aborted, consumed, cursor, stable, cand,
          candXmax, claim, events>>

ProdRec  == [phase : Phases, xid : Xids, seq : Seqs]
ClaimRec == [phase : CPhases, vseq : Seqs, xid : Xids]

TypeOK ==
    /\ nextXid \in 1..MaxXid + 1
    /\ nextSeq \in 1..NSeqs + 1
    /\ latest \in Xids
    /\ prod \in [Producers -> ProdRec]
    /\ entries \subseteq 1..NSeqs
    /\ aborted \subseteq 1..NSeqs
    /\ consumed \subseteq entries
    /\ cursor \in 1..NSeqs + 1
    /\ stable \in Seqs
    /\ cand \in Seqs
    /\ candXmax \in Xids
    /\ claim \in ClaimRec
    /\ events \subseteq Events

---------------------------------------------------------------------------------------
(* Helpers *)

Min(S) == CHOOSE x \in S : \A y \in S : x <= y
Max(a, b) == IF a >= b THEN a ELSE b

\* The xids of the transactions running now, given the claim's own xid x (0: none).
Running(x) ==
    {prod[p].xid : p \in {q \in Producers : prod[q].phase \in {"xid", "drawn"}}}
    \cup (IF x = 0 THEN {} ELSE {x})

\* Seqs drawn by producers still running.
PendingSeqs == {prod[p].seq : p \in {q \in Producers : prod[q].phase = "drawn"}}

IdleClaim == [phase |-> "idle", vseq |-> 0, xid |-> 0]

---------------------------------------------------------------------------------------
(* Actions *)

\* Producer p's transaction holds its xid (the hold_xid trigger, before any seq).
Hold(p) ==
    /\ prod[p].phase = "idle"
    /\ nextXid <= MaxXid
    /\ prod' = [prod EXCEPT ![p] = [phase |-> "xid", xid |-> nextXid, seq |-> 0]]
    /\ nextXid' = nextXid + 1
    /\ UNCHANGED <<nextSeq, latest, entries, aborted, consumed, cursor, stable, cand,
                   candXmax, claim, events>>

\* Producer p draws the next seq and appends its entry, uncommitted.
Draw(p) ==
    /\ prod[p].phase = "xid"
    /\ prod' = [prod EXCEPT ![p].phase = "drawn", ![p].seq = nextSeq]
    /\ nextSeq' = nextSeq + 1
    /\ UNCHANGED <<nextXid, latest, entries, aborted, consumed, cursor, stable, cand,
                   candXmax, claim, events>>

\* Producer p commits: its entry becomes visible.
Commit(p) ==
    /\ prod[p].phase = "drawn"
    /\ prod' = [prod EXCEPT ![p].phase = "done"]
    /\ entries' = entries \cup {prod[p].seq}
    /\ latest' = Max(latest, prod[p].xid)
    /\ UNCHANGED <<nextXid, nextSeq, aborted, consumed, cursor, stable, cand, candXmax,
                   claim, events>>

\* Producer p rolls back: its seq is a gap.
Abort(p) ==
    /\ prod[p].phase = "drawn"
    /\ prod' = [prod EXCEPT ![p].phase = "done"]
    /\ aborted' = aborted \cup {prod[p].seq}
    /\ latest' = Max(latest, prod[p].xid)
    /\ UNCHANGED <<nextXid, nextSeq, entries, consumed, cursor, stable, cand, candXmax,
                   claim, events>>

\* A claim starts (qs_claim_queue's first statement): it reads the last seq drawn
\* while its transaction holds no xid (SeqReadAfterXid: it holds its xid first).
ClaimBegin ==
    /\ claim.phase = "idle"
    /\ IF Variant = "SeqReadAfterXid"
          THEN /\ nextXid <= MaxXid
               /\ claim' = [phase |-> "begun", vseq |-> 0, xid |-> nextXid]
               /\ nextXid' = nextXid + 1
          ELSE /\ claim' = [phase |-> "begun", vseq |-> nextSeq - 1, xid |-> 0]
               /\ UNCHANGED nextXid
    /\ UNCHANGED <<nextSeq, latest, prod, entries, aborted, consumed, cursor, stable, cand,
                   candXmax, events>>

\* The lane's claim (qs_claim), one snapshot under the lane's row lock, which assigns
\* the claim's xid (SeqReadAfterXid: it had one, and reads the last seq drawn now).
ClaimLane ==
    LET x        == IF Variant = "SeqReadAfterXid" THEN claim.xid ELSE nextXid
        vseq     == IF Variant = "SeqReadAfterXid" THEN nextSeq - 1 ELSE claim.vseq
        xmin     == Min(Running(x))
        ok       == candXmax <= xmin
        stable1  == IF ok THEN Max(stable, cand) ELSE stable
        renew    == ok /\ vseq > cand
        horizon  == IF Variant = "HorizonFromSnapshotXmax" THEN latest + 1 ELSE x
        ready    == {s \in entries \ consumed : s >= cursor}
    IN
    /\ claim.phase = "begun"
    /\ Variant = "SeqReadAfterXid" \/ nextXid <= MaxXid
    /\ nextXid' = IF Variant = "SeqReadAfterXid" THEN nextXid ELSE nextXid + 1
    /\ stable' = stable1
    /\ cand' = IF renew THEN vseq ELSE cand
    /\ candXmax' = IF renew THEN horizon ELSE candXmax
    /\ IF ready = {}
          THEN /\ cursor' = Max(cursor, stable1 + 1)
               /\ UNCHANGED consumed
          ELSE LET s == Min(ready) IN
               /\ consumed' = consumed \cup {s}
               /\ cursor' = Max(cursor, IF s + 1 <= stable1 + 1 THEN s + 1 ELSE stable1 + 1)
    /\ claim' = [phase |-> "lane", vseq |-> vseq, xid |-> x]
    /\ events' = events
                 \cup (IF ok THEN {} ELSE {"heldBack"})
                 \cup (IF \E g \in aborted : g >= cursor /\ g < cursor' THEN {"gapPassed"}
                       ELSE {})
                 \cup (IF ready # {} /\ \E c \in consumed : c > Min(ready) THEN {"lateClaim"}
                       ELSE {})
    /\ UNCHANGED <<nextSeq, latest, prod, entries, aborted>>

\* The claim commits.
ClaimEnd ==
    /\ claim.phase = "lane"
    /\ claim' = IdleClaim
    /\ latest' = Max(latest, claim.xid)
    /\ UNCHANGED <<nextXid, nextSeq, prod, entries, aborted, consumed, cursor, stable, cand,
                   candXmax, events>>

\* The search's bound on xids stops every next step that needs one: stutter rather
\* than deadlock.
Quiescent ==
    /\ nextXid > MaxXid
    /\ UNCHANGED vars

---------------------------------------------------------------------------------------

Init ==
    /\ nextXid = 1
    /\ nextSeq = 1
    /\ latest = 0
    /\ prod = [p \in Producers |-> [phase |-> "idle", xid |-> 0, seq |-> 0]]
    /\ entries = {}
    /\ aborted = {}
    /\ consumed = {}
    /\ cursor = 1
    /\ stable = 0
    /\ cand = 0
    /\ candXmax = 0
    /\ claim = IdleClaim
    /\ events = {}

Next ==
    \/ \E p \in Producers : Hold(p) \/ Draw(p) \/ Commit(p) \/ Abort(p)
    \/ ClaimBegin
    \/ ClaimLane
    \/ ClaimEnd
    \/ Quiescent

Spec == Init /\ [][Next]_vars

---------------------------------------------------------------------------------------
(* Invariants *)

\* No entry a claim could still take, nor a seq a running producer may still commit,
\* lies below the cursor (no claim would ever look at it).
CursorNeverPassesWork ==
    \A s \in (entries \ consumed) \cup PendingSeqs : s >= cursor

\* Positive configuration only: the stable point is settled, every seq at or below
\* it committed or rolled back (the lemma the cursor's bound rests on).
StableSettled ==
    \A s \in PendingSeqs : s > stable

---------------------------------------------------------------------------------------
(* Witnesses: states the correct protocol must reach (check ~W and expect a violation). *)

\* The stable point moved.
WitnessStableAdvanced == stable > 0

\* A claim found its candidate not yet confirmed (a producer below its horizon ran).
WitnessHeldBack == "heldBack" \in events

\* The cursor moved past a rolled-back seq.
WitnessGapPassed == "gapPassed" \in events

\* A claim took a seq below one already taken (its producer committed late).
WitnessLateCommitClaimed == "lateClaim" \in events

=======================================================================================
