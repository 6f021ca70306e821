package topology

import "slices"

// searcher looks for the best `need` GPUs of free to add to must.
type searcher struct {
	g    *Graph
	pool []int // must and free
	must []int
	free []int // sorted by position, so by device index
	need int

	best     []int // chosen positions, sorted
	bestSet  score // score of must + best
	bestRest *score
	restBuf  []int
}

// offer keeps chosen (sorted positions; copied) if it beats the best so far:
// a higher set score, then better connected leftovers, then, when lexical is
// set, lower device indices. The exhaustive search offers sets in ascending
// index order, so for it the first of equals is already the lowest.
func (s *searcher) offer(chosen []int, set score, lexical bool) {
	if s.best != nil {
		if c := set.cmp(s.bestSet); c < 0 {
			return
		} else if c == 0 {
			if s.bestRest == nil {
				r := s.rest(s.best)
				s.bestRest = &r
			}
			r := s.rest(chosen)
			if c := r.cmp(*s.bestRest); c < 0 || c == 0 && (!lexical || slices.Compare(chosen, s.best) >= 0) {
				return
			}
			s.best = append(s.best[:0], chosen...)
			s.bestSet, s.bestRest = set, &r
			return
		}
	}
	s.best = append(s.best[:0], chosen...)
	s.bestSet, s.bestRest = set, nil
}

// rest scores the free GPUs that chosen leaves for later requests.
func (s *searcher) rest(chosen []int) score {
	s.restBuf = s.restBuf[:0]
	i := 0
	for _, p := range s.free {
		if i < len(chosen) && chosen[i] == p {
			i++
			continue
		}
		s.restBuf = append(s.restBuf, p)
	}
	return s.g.setScore(s.restBuf)
}

// exhaustive offers every need-subset of free, in ascending index order.
func (s *searcher) exhaustive() []int {
	set := append(make([]int, 0, len(s.must)+s.need), s.must...)
	var walk func(start int, sc score)
	walk = func(start int, sc score) {
		left := len(s.must) + s.need - len(set)
		if left == 0 {
			s.offer(set[len(s.must):], sc, false)
			return
		}
		for i := start; i <= len(s.free)-left; i++ {
			p := s.free[i]
			add := sc
			for _, m := range set {
				add = add.plus(s.g.pair[m][p])
			}
			set = append(set, p)
			walk(i+1, add)
			set = set[:len(set)-1]
		}
	}
	walk(0, s.g.setScore(s.must))
	return s.best
}

// greedy grows a set from each free GPU in turn, adding at each step the GPU
// that adds most to the set score (the lowest index of equals), and keeps the
// best set found. It is for requests with too many candidate sets to try
// one by one; it finds islands of linked GPUs but not every optimum.
func (s *searcher) greedy() []int {
	gain := make([]score, len(s.free))
	taken := make([]bool, len(s.free))
	set := make([]int, 0, len(s.must)+s.need)
	chosen := make([]int, 0, s.need)
	for seed := range s.free {
		clear(taken)
		set = append(set[:0], s.must...)
		chosen = chosen[:0]
		for i, p := range s.free {
			gain[i] = score{}
			for _, m := range set {
				gain[i] = gain[i].plus(s.g.pair[m][p])
			}
		}
		next := seed
		for {
			p := s.free[next]
			taken[next] = true
			set = append(set, p)
			chosen = append(chosen, p)
			if len(chosen) == s.need {
				break
			}
			next = -1
			for i, q := range s.free {
				if taken[i] {
					continue
				}
				gain[i] = gain[i].plus(s.g.pair[p][q])
				if next < 0 || gain[i].cmp(gain[next]) > 0 {
					next = i
				}
			}
		}
		slices.Sort(chosen)
		s.offer(chosen, s.g.setScore(set), true)
	}
	return s.best
}
