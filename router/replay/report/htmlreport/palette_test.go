package htmlreport

import (
	"image/color"
	"math"
	"strings"
	"testing"
)

// lab is c in CIE L*a*b* (D65), from sRGB.
func lab(c color.RGBA) (l, a, b float64) {
	lin := func(v uint8) float64 {
		x := float64(v) / 255
		if x <= 0.04045 {
			return x / 12.92
		}
		return math.Pow((x+0.055)/1.055, 2.4)
	}
	r, g, bl := lin(c.R), lin(c.G), lin(c.B)
	x := (0.4124*r + 0.3576*g + 0.1805*bl) / 0.95047
	y := 0.2126*r + 0.7152*g + 0.0722*bl
	z := (0.0193*r + 0.1192*g + 0.9505*bl) / 1.08883
	f := func(t float64) float64 {
		if t > 216.0/24389 {
			return math.Cbrt(t)
		}
		return (24389.0/27*t + 16) / 116
	}
	return 116*f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))
}

// deltaE is the CIE76 colour difference of two colours.
func deltaE(p, q color.RGBA) float64 {
	l1, a1, b1 := lab(p)
	l2, a2, b2 := lab(q)
	return math.Sqrt((l1-l2)*(l1-l2) + (a1-a2)*(a1-a2) + (b1-b2)*(b1-b2))
}

// The policies' palette has twelve colours, every two of them at least
// a CIE76 ΔE of 25 apart (clearly different side by side, for normal
// vision; the palettes' authors chose them for colour-blind readers).
// Colours past the twelfth repeat with another dash pattern.
func TestPaletteIsDistinct(t *testing.T) {
	if len(Palette) != 12 {
		t.Fatalf("%d colours, want 12", len(Palette))
	}
	least := math.Inf(1)
	for i := range Palette {
		for j := i + 1; j < len(Palette); j++ {
			d := deltaE(Palette[i], Palette[j])
			least = min(least, d)
			if d < 25 {
				t.Errorf("colours %d %v and %d %v: ΔE %.1f, want >= 25", i, Palette[i], j, Palette[j], d)
			}
		}
	}
	t.Logf("least ΔE between two colours: %.1f", least)
	c0, d0 := colorOf(0)
	c12, d12 := colorOf(12)
	if c0 != c12 || len(d0) != 0 || len(d12) == 0 {
		t.Errorf("policy 12: %v %v, want policy 0's colour %v with a dash pattern (policy 0: %v)", c12, d12, c0, d0)
	}
}

// A chart whose lines are within FlatShare of its range of each other
// is collapsed with a note; one with a larger gap, or of one line, is
// not.
func TestCollapseRule(t *testing.T) {
	nan := math.NaN()
	close := [][]float64{{1, 2, 3, nan}, {1.01, 2.01, 3.019, 9}}
	if note := collapseNote(close, 1, "E2E CDF"); !strings.HasPrefix(note, "E2E CDF: the 2 lines lie within 1.9% of the axis range") {
		t.Errorf("gap 0.019 of 1: note %q, want collapsed", note)
	}
	if note := collapseNote(close, 0.9, "E2E CDF"); note != "" {
		t.Errorf("gap 0.019 of 0.9 (2.1%%): note %q, want none", note)
	}
	if note := collapseNote(close[:1], 1, "x"); note != "" {
		t.Errorf("one line: note %q, want none", note)
	}
	if gap, ok := flatness([][]float64{{nan}, {1}}); ok {
		t.Errorf("no shared point: gap %v, want none", gap)
	}
}
