package relay

import (
	"slices"
	"sync"
	"testing"
)

// A wake-up that comes while a worker ships is kept: when the worker runs
// out of rows it reads its shard again instead of waiting for the next
// poll. (Before, the dispatcher dropped it, and a row committed after the
// worker's last read-ahead waited a PollInterval: TestWakesOnNotification
// failed that way in a soak at load 66, its next row 10 s late with a
// one-minute poll.)
func TestWakeWhileBusyIsKept(t *testing.T) {
	var w turn // busy: not idle
	if w.claim(true) {
		t.Fatal("the dispatcher claimed a busy worker")
	}
	if !w.rest() {
		t.Fatal("the worker went idle past a wake-up that came while it was busy")
	}
	if w.claim(false) {
		t.Fatal("a worker reading again was claimed by the dispatcher")
	}
	// Having read again, it rests with nothing new: it waits for the dispatcher.
	if w.rest() {
		t.Fatal("a wake-up counted twice")
	}
	if !w.claim(false) {
		t.Fatal("the dispatcher could not claim an idle worker")
	}
	w.free()
	// A poll that finds it busy leaves no word: only a wake-up announces rows.
	w.claim(false)
	w.idle.Store(false)
	if w.claim(false) || w.rest() {
		t.Fatal("a poll that found the worker busy made it read again")
	}
}

// Whatever the interleaving of a wake-up with a busy worker going idle,
// exactly one side reads the shard after the wake-up: the dispatcher claims
// the worker, or the worker reads again; never neither (a lost wake-up),
// never both (two reads of one shard at once).
func TestWakeTakenByExactlyOneSide(t *testing.T) {
	for i := range 20000 {
		var (
			w                  turn
			claimed, readAgain bool
			wg                 sync.WaitGroup
			start              = make(chan struct{})
		)
		wg.Add(2)
		go func() { defer wg.Done(); <-start; claimed = w.claim(true) }()
		go func() { defer wg.Done(); <-start; readAgain = w.rest() }()
		close(start)
		wg.Wait()
		if claimed == readAgain {
			t.Fatalf("round %d: dispatcher claimed %v, worker reads again %v: want exactly one", i, claimed, readAgain)
		}
	}
}

// Wake-ups name shards until the dispatcher takes them; one that names
// none names every shard.
func TestWakeUpsAddUp(t *testing.T) {
	r := &Relay{wake: make(chan struct{}, 1)}
	r.Wake(3)
	r.Wake(5, 3)
	u := r.takeWakeUp()
	for shard, want := range map[int]bool{3: true, 5: true, 4: false} {
		if got := u.names(shard); got != want {
			t.Errorf("after Wake(3), Wake(5, 3): shard %d named %v, want %v", shard, got, want)
		}
	}
	if u := r.takeWakeUp(); u.names(3) {
		t.Error("a wake-up taken twice")
	}
	r.Wake(3)
	r.Wake()
	if u := r.takeWakeUp(); !u.names(4) {
		t.Error("Wake() did not name every shard")
	}
}

// WakeHeld wakes the relay for the shards it holds and returns the
// others, which ingest then notifies: a shard whose worker is giving it
// back, or whose lease is gone, is another relay's to ship.
func TestWakeHeldReturnsTheOthers(t *testing.T) {
	releasing, gone := &worker{shard: 5}, &worker{shard: 6}
	releasing.releasing.Store(true)
	gone.gone.Store(true)
	r := &Relay{wake: make(chan struct{}, 1), workers: map[int]*worker{3: {shard: 3}, 5: releasing, 6: gone}}
	if others := r.WakeHeld(3, 5, 6, 7, 3); !slices.Equal(others, []int{5, 6, 7}) {
		t.Errorf("WakeHeld(3, 5, 6, 7, 3) returned %v, want [5 6 7]", others)
	}
	u := r.takeWakeUp()
	for shard, want := range map[int]bool{3: true, 5: false, 6: false, 7: false} {
		if got := u.names(shard); got != want {
			t.Errorf("shard %d woken %v, want %v", shard, got, want)
		}
	}
	if others := r.WakeHeld(3); others != nil {
		t.Errorf("WakeHeld(3) returned %v, want nil: the relay holds it", others)
	}
	if others := r.WakeHeld(8); !slices.Equal(others, []int{8}) {
		t.Errorf("WakeHeld(8) returned %v, want [8]", others)
	}
	if u := r.takeWakeUp(); u.all || u.names(8) {
		t.Error("WakeHeld of no held shard woke the relay for shards it does not hold")
	}
}
