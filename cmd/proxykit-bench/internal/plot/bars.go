package plot

import (
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// BarSeries is one bar per category, e.g. one size.
type BarSeries struct {
	Name string
	// Values has one value per category; NaN or zero draws no bar.
	Values []float64
}

// BarChart is a chart of horizontal bars, grouped by category (e.g. a
// data path), one bar of each series per category, on a linear axis.
type BarChart struct {
	Title, ValueLabel string
	// Categories read from the top down.
	Categories []string
	Series     []BarSeries
}

// BarsSVG writes c to path as an SVG image.
func BarsSVG(path string, c BarChart) error {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.ValueLabel
	p.X.Min = 0
	grid := plotter.NewGrid()
	grid.Horizontal.Color = nil
	p.Add(grid)
	n := len(c.Categories)
	w := vg.Points(min(14, 36/float64(max(1, len(c.Series)))))
	for i, s := range c.Series {
		vals := make(plotter.Values, n)
		for j := range n {
			// Category 0 at the top: gonum counts from the bottom.
			if v := s.Values[j]; !math.IsNaN(v) && v > 0 {
				vals[n-1-j] = v
			}
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		b.Horizontal = true
		b.Color = palette[i%len(palette)]
		b.LineStyle.Width = 0
		// The first series on top within a group.
		b.Offset = w * vg.Length(float64(len(c.Series)-1)/2-float64(i))
		p.Add(b)
		p.Legend.Add(s.Name, b)
	}
	labels := make([]string, n)
	for j, l := range c.Categories {
		labels[n-1-j] = l
	}
	p.NominalY(labels...)
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(8)
	p.Legend.YOffs = vg.Points(8)
	return p.Save(9*vg.Inch, vg.Length(1.2+0.45*float64(n))*vg.Inch, path)
}
