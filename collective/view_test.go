package collective_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
)

// TestView: two views of a world of four, ranks {2, 3} and {0, 1} in each
// other's order, run their own all-reduce by view ranks; a view's group is
// the World's group of the world ranks, a view's size and rank are the
// view's, a rank outside a view is refused, and a view's failure is the
// World's.
func TestView(t *testing.T) {
	ws := localWorlds(t, 4, collective.Options{})
	defer func() {
		for _, w := range ws {
			w.Close()
		}
	}()
	ctx := context.Background()
	views := [][]int{{1, 0}, {1, 0}, {2, 3}, {2, 3}}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	got := make([][]float32, 4)
	for r, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := w.View(views[r])
			if err != nil {
				errs[r] = err
				return
			}
			if v.Size() != 2 || v.Rank() != slices.Index(views[r], r) {
				errs[r] = errors.New("view: wrong size or rank")
				return
			}
			g, err := v.WorldGroup(ctx)
			if err != nil {
				errs[r] = err
				return
			}
			if !slices.Equal(g.Ranks(), views[r]) || g.World() != w {
				errs[r] = errors.New("view: its group is not the World's of the world ranks")
				return
			}
			buf := []float32{float32(r + 1)}
			errs[r] = collective.AllReduce(ctx, g, buf, collective.Sum)
			got[r] = buf
		}()
	}
	wg.Wait()
	for r := range ws {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
	if want := [][]float32{{3}, {3}, {7}, {7}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("all-reduces through the views gave %v, want %v", got, want)
	}
	if _, err := ws[0].View([]int{2, 3}); !errors.Is(err, collective.ErrInvalid) {
		t.Errorf("a view without the rank: %v, want ErrInvalid", err)
	}
	v, _ := ws[2].View([]int{2, 3})
	if err := v.Close(); err != nil || ws[2].Err() != nil {
		t.Errorf("closing a view: %v; the World: %v", err, ws[2].Err())
	}
	v.Fail(errors.New("boom"))
	if ws[2].Err() == nil || v.Err() == nil {
		t.Errorf("a view's failure is not its World's: %v, %v", ws[2].Err(), v.Err())
	}
}
