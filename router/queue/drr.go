package queue

// drr is the round-robin state of deficit round robin (Shreedhar and
// Varghese, SIGCOMM '95) over the backlogged classes.
//
// The paper's active list is a FIFO whose head is being visited; here it
// is a ring with a cursor: ring[cur] is the head, and granted says whether
// the head has already been credited its quantum for this visit. A visit
// credits the quantum once, then serves head items while the head item's
// cost fits in the deficit, then moves on. Pop serves one item, so the
// visit is spread over successive Pops.
//
// Visiting class by class would take cost/quantum rounds when costs are
// large against the quantum. choose instead computes, for every class, the
// first round in which its head item fits, and commit credits all the
// quanta of the rounds skipped at once: the same sequence as the paper's
// loop, in O(C) for C backlogged classes.
type drr struct {
	ring    []int32 // backlogged classes in visiting order
	cur     int     // index in ring of the class being visited
	granted bool    // ring[cur] has been credited for this visit
}

// at returns the class at offset off from the cursor.
func (d *drr) at(off int) int32 { return d.ring[(d.cur+off)%len(d.ring)] }

// activate adds a class that just became backlogged at the tail of the
// active list: last in the current round, just before the cursor.
func (d *drr) activate(ci int32) {
	if len(d.ring) == 0 {
		d.ring = append(d.ring, ci)
		d.cur, d.granted = 0, false
		return
	}
	d.ring = append(d.ring, 0)
	copy(d.ring[d.cur+1:], d.ring[d.cur:])
	d.ring[d.cur] = ci
	d.cur++
}

// deactivate removes a class that emptied; the caller resets its deficit.
// When it was being visited, the next class's visit starts.
func (d *drr) deactivate(ci int32) {
	i := 0
	for d.ring[i] != ci {
		i++
	}
	d.ring = append(d.ring[:i], d.ring[i+1:]...)
	switch {
	case i < d.cur:
		d.cur--
	case i == d.cur:
		d.granted = false
	}
	if d.cur >= len(d.ring) {
		d.cur = 0
	}
}

// choose returns the offset from the cursor of the class DRR serves next
// and the number of further visits to the cursor's position (rounds) it
// first needs. There is at least one backlogged class.
//
// The class at offset o gets its m-th visit (m = 0, 1, ...) in round m,
// credited m+1 quanta by then, or m when o = 0 and the current visit was
// already credited. Its head fits at the first m with deficit + credits >=
// cost; visits happen in (m, o) order, so the winner minimises (m, o).
func (d *drr) choose(classes []*class) (off int, rounds int64) {
	rounds = -1
	for o := range d.ring {
		c := classes[d.at(o)]
		var m int64
		if need := c.heap.At(0).cost - c.deficit; need > 0 {
			m = need / c.quantum // credits needed, rounded up
			if need%c.quantum != 0 {
				m++
			}
			if o > 0 || !d.granted {
				m-- // the first visit credits one
			}
		}
		if rounds < 0 || m < rounds {
			off, rounds = o, m
			if m == 0 {
				break
			}
		}
	}
	return off, rounds
}

// commit credits every class the quanta of the visits up to the winner's
// (offset off, in round rounds), moves the cursor to the winner with its
// visit credited, and returns the winner. The caller charges its deficit.
func (d *drr) commit(classes []*class, off int, rounds int64) int32 {
	for o := range d.ring {
		visits := rounds // rounds 0..rounds-1
		if o <= off {
			visits++ // and round `rounds` up to the winner
		}
		if o == 0 && d.granted {
			visits-- // the current visit was credited already
		}
		if visits > 0 {
			c := classes[d.at(o)]
			c.deficit += visits * c.quantum
		}
	}
	w := d.at(off)
	d.cur = (d.cur + off) % len(d.ring)
	d.granted = true
	return w
}
