package status

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The page's first paint comes from the server: /status is index.html
// filled with a reading (Build), so curl, a screenshot taken before the
// script ran and a browser without JavaScript see the figures; app.js then
// replaces each part with its own drawing and keeps it current. The
// template formats numbers as app.js does.

// firstPaint is what index.html is filled with.
type firstPaint struct {
	Status
	Summary string
}

var paintFuncs = template.FuncMap{
	"rate": func(v *float64) string {
		if v == nil {
			return "–"
		}
		switch {
		case *v >= 100:
			return strconv.FormatFloat(*v, 'f', 0, 64) + "/s"
		case *v >= 10:
			return strconv.FormatFloat(*v, 'f', 1, 64) + "/s"
		}
		return strconv.FormatFloat(*v, 'f', 2, 64) + "/s"
	},
	"count":     func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) },
	"seconds":   seconds,
	"secondsOf": func(v float64) string { return seconds(&v) },
	"timeOf": func(unix float64) string {
		return time.UnixMilli(int64(unix * 1000)).UTC().Format(time.RFC3339)
	},
}

func seconds(s *float64) string {
	switch {
	case s == nil:
		return "–"
	case *s == 0:
		return "0 s"
	case *s < 1e-3:
		return fmt.Sprintf("%.0f µs", *s*1e6)
	case *s < 1:
		return strconv.FormatFloat(*s*1e3, 'g', 3, 64) + " ms"
	case *s < 120:
		return fmt.Sprintf("%.1f s", *s)
	case *s < 7200:
		return fmt.Sprintf("%.1f min", *s/60)
	}
	return fmt.Sprintf("%.1f h", *s/3600)
}

// servePage serves index.html with a reading of now in it.
func (p *Page) servePage(assets fs.FS) (http.Handler, error) {
	b, err := fs.ReadFile(assets, "index.html")
	if err != nil {
		return nil, err
	}
	tmpl, err := template.New("index.html").Funcs(paintFuncs).Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("status: index.html: %w", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := p.Build(r.Context())
		summary := "components: " + strings.Join(st.Components, ", ") + " · read at " + st.At.UTC().Format(time.TimeOnly) + " UTC"
		if len(st.Unavailable) > 0 {
			summary += " · not read: " + strings.Join(st.Unavailable, ", ")
		}
		var out bytes.Buffer
		if err := tmpl.Execute(&out, firstPaint{Status: st, Summary: summary}); err != nil {
			http.Error(w, "the status page could not be drawn", http.StatusInternalServerError)
			return
		}
		securityHeaders(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(out.Bytes())
	}), nil
}
