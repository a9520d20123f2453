package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// chartBar is one scenario's throughput ratio.
type chartBar struct {
	label            string
	median, min, max float64
	target           float64 // NaN: no target (drawn grey, without a line)
}

// chartSVG draws the ratios as bars (median) with min-max whiskers and each
// scenario's target as a dashed line: plain SVG text, so the chart is
// produced and diffed like the report, without a plotting library.
func chartSVG(title string, bars []chartBar) string {
	const (
		width, height          = 720, 420
		left, right, top, bott = 60, 20, 50, 60
		plotW, plotH           = width - left - right, height - top - bott
	)
	yMax := 1.1
	for _, b := range bars {
		yMax = math.Max(yMax, math.Ceil((b.max+0.05)*10)/10)
	}
	y := func(v float64) float64 { return top + plotH*(1-v/yMax) }

	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`, width, height, width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>`)
	w(`<text x="%d" y="24" text-anchor="middle" font-size="14" font-weight="bold">%s</text>`, width/2, html.EscapeString(title))

	// Grid and y axis, with 1.0 (as fast as plain Caddy) darker.
	for v := 0.0; v <= yMax+1e-9; v += 0.2 {
		stroke := "#dddddd"
		if math.Abs(v-1) < 1e-9 {
			stroke = "#888888"
		}
		w(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/>`, left, width-right, y(v), y(v), stroke)
		w(`<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%.1f</text>`, left-8, y(v), v)
	}
	w(`<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">limited req/s / plain req/s</text>`, top+plotH/2, top+plotH/2)

	slot := float64(plotW) / float64(len(bars))
	for i, b := range bars {
		cx := left + slot*(float64(i)+0.5)
		bw := slot * 0.45
		fill := "#4e9a06" // target met
		switch {
		case math.IsNaN(b.target):
			fill = "#7a8a9a" // for information
		case b.median < b.target:
			fill = "#cc4b37" // missed
		}
		w(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, cx-bw/2, y(b.median), bw, y(0)-y(b.median), fill)
		// Whisker from the worst to the best run.
		w(`<g stroke="black" stroke-width="1.5"><line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/>`, cx, cx, y(b.min), y(b.max))
		w(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/><line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/></g>`,
			cx-8, cx+8, y(b.min), y(b.min), cx-8, cx+8, y(b.max), y(b.max))
		if math.IsNaN(b.target) {
			w(`<text x="%.1f" y="%.1f" text-anchor="middle">%.2f</text>`, cx, y(b.max)-8, b.median)
			w(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, cx, height-bott+20, html.EscapeString(b.label))
			continue
		}
		// Target.
		w(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#1f4e9a" stroke-width="2" stroke-dasharray="6 4"/>`,
			cx-bw/2-10, cx+bw/2+10, y(b.target), y(b.target))
		w(`<text x="%.1f" y="%.1f" fill="#1f4e9a" text-anchor="end">target %.2f</text>`, cx+bw/2+10, y(b.target)-5, b.target)
		w(`<text x="%.1f" y="%.1f" text-anchor="middle" font-weight="bold">%.2f</text>`, cx, y(b.max)-8, b.median)
		w(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, cx, height-bott+20, html.EscapeString(b.label))
	}
	w(`<text x="%d" y="%d" text-anchor="middle" fill="#555555">bar: median; whisker: min-max over runs; green: target met, red: missed, grey: no target</text>`, width/2, height-14)
	w(`</svg>`)
	return s.String()
}
