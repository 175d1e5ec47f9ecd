package queue

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// ref is a naive O(n) model of the queue: items in plain slices, the
// within-class order by a linear scan that evaluates effective priorities
// at the current time, and DRR as the paper's loop, one visit at a time.
type ref struct {
	classes []*refClass
	byName  map[string]int
	def     int
	aging   time.Duration
	maxLen  int
	ids     map[string]bool
	expired []*Item

	ring    []int
	cur     int
	granted bool
}

type refClass struct {
	name    string
	order   Order
	quantum int64
	deficit int64
	items   []*Item
}

func newRef(cfg Config) *ref {
	r := &ref{byName: map[string]int{}, aging: cfg.Aging, maxLen: cfg.MaxLen, ids: map[string]bool{}}
	base := cfg.Quantum
	if base == 0 {
		base = 1
	}
	for i, c := range cfg.Classes {
		order := c.Order
		if order == "" {
			order = FCFS
		}
		r.classes = append(r.classes, &refClass{name: c.Name, order: order, quantum: int64(c.Weight) * base})
		r.byName[c.Name] = i
	}
	if cfg.DefaultClass != "" {
		r.def = r.byName[cfg.DefaultClass]
	}
	return r
}

func (r *ref) held() int {
	n := len(r.expired)
	for _, c := range r.classes {
		n += len(c.items)
	}
	return n
}

func (r *ref) live() int { return r.held() - len(r.expired) }

func (r *ref) push(it *Item) error {
	ci := r.def
	if it.Class != "" {
		var ok bool
		if ci, ok = r.byName[it.Class]; !ok {
			return ErrUnknownClass
		}
	}
	if r.ids[it.ID] {
		return ErrDuplicate
	}
	if r.maxLen > 0 && r.held() >= r.maxLen {
		return ErrFull
	}
	r.ids[it.ID] = true
	c := r.classes[ci]
	c.items = append(c.items, it)
	if len(c.items) == 1 {
		if len(r.ring) == 0 {
			r.ring, r.cur, r.granted = []int{ci}, 0, false
		} else {
			r.ring = slices.Insert(r.ring, r.cur, ci)
			r.cur++
		}
	}
	return nil
}

// effective is an item's priority at now: one more for every aging tick
// (multiple of aging since the Unix epoch) passed since it arrived.
func (r *ref) effective(it *Item, now time.Time) int64 {
	p := int64(it.Priority)
	if r.aging > 0 {
		p += now.UnixNano()/int64(r.aging) - it.Arrival.UnixNano()/int64(r.aging)
	}
	return p
}

func (r *ref) best(c *refClass, now time.Time) int {
	bi := 0
	for i, it := range c.items[1:] {
		b := c.items[bi]
		d := cmp.Compare(r.effective(b, now), r.effective(it, now))
		if d == 0 {
			switch c.order {
			case LCFS:
				d = -it.Arrival.Compare(b.Arrival) // later first
			case WSPT:
				d = cmp.Compare(it.Cost, b.Cost)
			case Slack:
				switch {
				case (it.TTFT > 0) != (b.TTFT > 0):
					d = 1 // the one with a target first
					if it.TTFT > 0 {
						d = -1
					}
				case it.TTFT > 0:
					d = latestStart(it).Compare(latestStart(b))
				}
			}
		}
		if d == 0 {
			d = it.Arrival.Compare(b.Arrival)
		}
		if d == 0 {
			d = cmp.Compare(it.ID, b.ID)
		}
		if d < 0 {
			bi = i + 1
		}
	}
	return bi
}

// latestStart is a Slack item's latest useful start, the plain way.
func latestStart(it *Item) time.Time {
	return it.Arrival.Add(it.TTFT).Add(-max(it.PredictedTTFT, 0))
}

func (r *ref) take(ci, i int) *Item {
	c := r.classes[ci]
	it := c.items[i]
	c.items = slices.Delete(c.items, i, i+1)
	if len(c.items) == 0 {
		c.deficit = 0
		k := slices.Index(r.ring, ci)
		r.ring = slices.Delete(r.ring, k, k+1)
		if k < r.cur {
			r.cur--
		} else if k == r.cur {
			r.granted = false
		}
		if r.cur >= len(r.ring) {
			r.cur = 0
		}
	}
	return it
}

func (r *ref) setAside(now time.Time) {
	var due []*Item
	for _, c := range r.classes {
		for _, it := range c.items {
			if !it.DueAt.IsZero() && !it.DueAt.After(now) {
				due = append(due, it)
			}
		}
	}
	slices.SortFunc(due, func(a, b *Item) int {
		return cmp.Or(a.DueAt.Compare(b.DueAt), cmp.Compare(a.ID, b.ID))
	})
	for _, it := range due {
		ci := r.classOf(it)
		r.take(ci, slices.Index(r.classes[ci].items, it))
		r.expired = append(r.expired, it)
	}
}

func (r *ref) classOf(it *Item) int {
	if it.Class == "" {
		return r.def
	}
	return r.byName[it.Class]
}

// next runs DRR to the next item to serve; with commit false it restores
// the round-robin state afterwards.
func (r *ref) next(now time.Time, commit bool) *Item {
	r.setAside(now)
	if r.live() == 0 {
		return nil
	}
	deficits := make([]int64, len(r.classes))
	for i, c := range r.classes {
		deficits[i] = c.deficit
	}
	cur, granted := r.cur, r.granted
	for {
		ci := r.ring[r.cur]
		c := r.classes[ci]
		if !r.granted {
			c.deficit += c.quantum
			r.granted = true
		}
		bi := r.best(c, now)
		if it := c.items[bi]; it.Cost <= c.deficit {
			if !commit {
				for i, c := range r.classes {
					c.deficit = deficits[i]
				}
				r.cur, r.granted = cur, granted
				return it
			}
			c.deficit -= it.Cost
			delete(r.ids, it.ID)
			return r.take(ci, bi)
		}
		r.cur = (r.cur + 1) % len(r.ring)
		r.granted = false
	}
}

func (r *ref) remove(id string) *Item {
	for ci, c := range r.classes {
		for i, it := range c.items {
			if it.ID == id {
				delete(r.ids, id)
				return r.take(ci, i)
			}
		}
	}
	for i, it := range r.expired {
		if it.ID == id {
			delete(r.ids, id)
			r.expired = slices.Delete(r.expired, i, i+1)
			return it
		}
	}
	return nil
}

func (r *ref) expire(now time.Time) []*Item {
	r.setAside(now)
	out := r.expired
	r.expired = nil
	for _, it := range out {
		delete(r.ids, it.ID)
	}
	return out
}

func ids(items []*Item) []string {
	s := make([]string, len(items))
	for i, it := range items {
		s[i] = it.ID
	}
	return s
}

func idOf(it *Item) string {
	if it == nil {
		return "<none>"
	}
	return it.ID
}

// TestModel runs 10,000 random operations against the queue and the naive
// model and requires the same result from every one.
func TestModel(t *testing.T) {
	configs := []Config{
		{Classes: []ClassConfig{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}},
		{Classes: []ClassConfig{{Name: "a", Weight: 2, Order: LCFS}, {Name: "b", Weight: 1, Order: WSPT}, {Name: "c", Weight: 5}}, Aging: time.Second, DefaultClass: "c"},
		{Classes: []ClassConfig{{Name: "a", Weight: 1, Order: WSPT}, {Name: "b", Weight: 4, Order: FCFS}, {Name: "c", Weight: 2, Order: LCFS}}, Aging: 300 * time.Millisecond, Quantum: 17, MaxLen: 60},
		{Classes: []ClassConfig{{Name: "a", Weight: 1, Order: LCFS}}, Aging: 50 * time.Millisecond, Quantum: 64},
		{Classes: []ClassConfig{{Name: "a", Weight: 2, Order: Slack}, {Name: "b", Weight: 1, Order: FCFS}}, Aging: time.Second},
		{Classes: []ClassConfig{{Name: "a", Weight: 1, Order: Slack}}},
	}
	for n, cfg := range configs {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 42))
			q := mustNew(t, cfg)
			r := newRef(cfg)
			now := t0.Add(123 * time.Millisecond)
			names := []string{""}
			for _, c := range cfg.Classes {
				names = append(names, c.Name)
			}
			var live []string // ids pushed, maybe gone since
			nextID := 0
			for op := range 10_000 {
				fail := func(format string, args ...any) {
					t.Helper()
					t.Fatalf("op %d: %s", op, fmt.Sprintf(format, args...))
				}
				switch k := rng.IntN(100); {
				case k < 40: // push
					nextID++
					it := &Item{
						ID:       fmt.Sprint(nextID),
						Class:    names[rng.IntN(len(names))],
						Priority: rng.IntN(5),
						Cost:     1 + rng.Int64N(64),
						Arrival:  now.Add(-time.Duration(rng.IntN(2000)) * time.Millisecond),
					}
					switch rng.IntN(20) {
					case 0:
						it.Class = "nope"
					case 1:
						if len(live) > 0 {
							it.ID = live[rng.IntN(len(live))]
						}
					}
					if rng.IntN(2) == 0 {
						it.DueAt = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
					}
					if rng.IntN(3) > 0 { // read by the slack order only
						it.TTFT = time.Duration(rng.IntN(3000)) * time.Millisecond
						it.PredictedTTFT = time.Duration(rng.IntN(1500)-100) * time.Millisecond
					}
					got, want := q.Push(it), r.push(it)
					if !errors.Is(got, want) || (want == nil) != (got == nil) {
						fail("Push(%s): %v, model %v", it.ID, got, want)
					}
					if got == nil {
						live = append(live, it.ID)
					}
				case k < 65:
					got, _ := q.Pop(now)
					if want := r.next(now, true); got != want {
						fail("Pop: %s, model %s", idOf(got), idOf(want))
					}
				case k < 75:
					got, _ := q.Peek(now)
					if want := r.next(now, false); got != want {
						fail("Peek: %s, model %s", idOf(got), idOf(want))
					}
				case k < 85:
					id := "nope"
					if len(live) > 0 {
						id = live[rng.IntN(len(live))]
					}
					got, _ := q.Remove(id)
					if want := r.remove(id); got != want {
						fail("Remove(%s): %s, model %s", id, idOf(got), idOf(want))
					}
				case k < 90:
					got, want := ids(q.Expire(now, nil)), ids(r.expire(now))
					if !slices.Equal(got, want) {
						fail("Expire: %v, model %v", got, want)
					}
				default:
					now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
				}
				if q.Len() != r.live() {
					fail("Len %d, model %d", q.Len(), r.live())
				}
				for ci, c := range r.classes {
					if got := q.ClassLen(c.name); got != len(c.items) {
						fail("ClassLen(%s) %d, model %d", c.name, got, len(c.items))
					}
					if got := q.classes[ci].deficit; got != c.deficit {
						fail("deficit of %s %d, model %d", c.name, got, c.deficit)
					}
				}
			}
		})
	}
}
