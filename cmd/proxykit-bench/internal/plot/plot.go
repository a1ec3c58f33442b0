package plot

import (
	"fmt"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one line of a chart.
type Series struct {
	// Name labels the line in the legend; an empty name keeps it out.
	Name string
	// X and Y are the points, X ascending; Y must be positive.
	X, Y []float64
	// Style picks the color and glyph; series of one dataplane share it.
	Style int
	// Dashed draws a dashed line without glyphs (e.g. a p99 next to the
	// median).
	Dashed bool
}

// Chart is one chart.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
}

// SVG writes c to path as an SVG image. The axes are logarithmic; the
// y axis is stretched upwards to leave room for the legend.
func SVG(path string, c Chart) error {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.Y.Tick.Marker = logTicks{}
	p.Add(plotter.NewGrid())
	ymin, ymax := math.Inf(1), math.Inf(-1)
	xmin, xmax := math.Inf(1), math.Inf(-1)
	named := 0
	for _, s := range c.Series {
		if len(s.X) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(s.X))
		for i := range s.X {
			if s.X[i] <= 0 || s.Y[i] <= 0 {
				return fmt.Errorf("plot %s: non-positive point in %q", c.Title, s.Name)
			}
			xys[i].X, xys[i].Y = s.X[i], s.Y[i]
			ymin, ymax = min(ymin, s.Y[i]), max(ymax, s.Y[i])
			xmin, xmax = min(xmin, s.X[i]), max(xmax, s.X[i])
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.Color = palette[s.Style%len(palette)]
		l.Width = vg.Points(1.5)
		if s.Dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			l.Width = vg.Points(1)
			p.Add(l)
		} else {
			pts, err := plotter.NewScatter(xys)
			if err != nil {
				return err
			}
			pts.Color = l.Color
			pts.Shape = plotutil.Shape(s.Style)
			pts.Radius = vg.Points(3)
			p.Add(l, pts)
			if s.Name != "" {
				p.Legend.Add(s.Name, l, pts)
				named++
			}
			continue
		}
		if s.Name != "" {
			p.Legend.Add(s.Name, l)
			named++
		}
	}
	if math.IsInf(ymin, 0) {
		return fmt.Errorf("plot %s: no data", c.Title)
	}
	// Room above the data for the legend, one decade per four entries.
	p.Y.Min = math.Pow(10, math.Floor(math.Log10(ymin)))
	top := math.Pow(10, math.Ceil(math.Log10(ymax)+0.01))
	p.Y.Max = top * math.Pow(10, math.Ceil(float64(named)/4))
	p.X.Min, p.X.Max = xmin/1.3, xmax*1.3
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(4)
	p.Legend.ThumbnailWidth = vg.Points(24)
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

// palette is Tableau's ten colours: told apart easily, also in print.
var palette = []color.Color{
	color.RGBA{0x4e, 0x79, 0xa7, 0xff}, // blue
	color.RGBA{0xf2, 0x8e, 0x2b, 0xff}, // orange
	color.RGBA{0xe1, 0x57, 0x59, 0xff}, // red
	color.RGBA{0x76, 0xb7, 0xb2, 0xff}, // teal
	color.RGBA{0x59, 0xa1, 0x4f, 0xff}, // green
	color.RGBA{0xed, 0xc9, 0x48, 0xff}, // yellow
	color.RGBA{0xb0, 0x7a, 0xa1, 0xff}, // purple
	color.RGBA{0xff, 0x9d, 0xa7, 0xff}, // pink
	color.RGBA{0x9c, 0x75, 0x5f, 0xff}, // brown
	color.RGBA{0xba, 0xb0, 0xac, 0xff}, // grey
}

// logTicks labels the powers of ten with plain numbers (1, 10, 100,
// 1000, 10000; 0.1, 0.01) and marks 2 and 5 between them, unlabelled.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		base := math.Pow(10, e)
		for _, m := range []float64{1, 2, 5} {
			v := base * m
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			out = append(out, t)
		}
	}
	return out
}
