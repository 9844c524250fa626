package compose

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// metricNames returns the metric names a PromQL expression (as Grafana and
// Prometheus rule files hold it) selects, sorted and without duplicates.
//
// Prometheus's own parser (github.com/prometheus/prometheus/promql/parser)
// is not in this module's graph, and bringing it in would pull in the
// whole Prometheus server module and its dependencies for one test, so
// this is a tokenizer that knows where PromQL puts names that are not
// metrics: label names inside {…} and in by/without/on/ignoring/group_*
// lists, function and aggregation names (an identifier followed by "("),
// keywords, strings, numbers, durations and whatever sits in […]. Grafana's
// variables ($var, ${var}, [[var]]) are skipped. What it cannot check — a
// name chosen by a regular expression (__name__=~"…") — is an error.
// promtool, where installed, checks the syntax of the same expressions
// (TestDashboardExpressionsParse).
func metricNames(expr string) ([]string, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	braces, brackets := 0, 0
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := func(k int) token {
			if i+k < len(toks) {
				return toks[i+k]
			}
			return token{}
		}
		switch {
		case t.kind == tokPunct:
			switch t.text {
			case "{":
				braces++
			case "}":
				braces--
			case "[":
				brackets++
			case "]":
				brackets--
			}
			if braces < 0 || brackets < 0 {
				return nil, fmt.Errorf("unbalanced %q in %q", t.text, expr)
			}
		case brackets > 0 || t.kind != tokIdent:
			// durations, subqueries, strings, numbers, variables
		case braces > 0:
			// a label name; __name__ names the metric
			if t.text == "__name__" {
				op, val := next(1), next(2)
				if op.text != "=" || val.kind != tokString {
					return nil, fmt.Errorf("__name__ %s in %q: only an exact name can be checked", op.text, expr)
				}
				names[val.text] = true
			}
		case next(1).text == "(":
			if labelLists[strings.ToLower(t.text)] {
				// skip the label list
				depth := 0
				for i++; i < len(toks); i++ {
					if toks[i].text == "(" {
						depth++
					} else if toks[i].text == ")" {
						if depth--; depth == 0 {
							break
						}
					}
				}
			}
			// otherwise a function or an aggregation
		case keywords[strings.ToLower(t.text)] || labelLists[strings.ToLower(t.text)]:
		case aggregations[strings.ToLower(t.text)] && labelLists[strings.ToLower(next(1).text)]:
			// "sum by (…) (…)"
		default:
			names[t.text] = true
		}
	}
	if braces != 0 || brackets != 0 {
		return nil, fmt.Errorf("unbalanced braces or brackets in %q", expr)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

var (
	labelLists   = setOf("by", "without", "on", "ignoring", "group_left", "group_right")
	keywords     = setOf("and", "or", "unless", "atan2", "bool", "offset", "inf", "nan")
	aggregations = setOf("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
		"bottomk", "topk", "quantile", "limitk", "limit_ratio")
)

func setOf(words ...string) map[string]bool {
	m := map[string]bool{}
	for _, w := range words {
		m[w] = true
	}
	return m
}

type tokenKind int

const (
	tokIdent tokenKind = iota + 1
	tokString
	tokNumber
	tokVariable
	tokPunct
)

type token struct {
	kind tokenKind
	text string // a string's value, unquoted
}

var (
	identRE  = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`)
	numberRE = regexp.MustCompile(`^(?:0[xX][0-9a-fA-F_]+|[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)(?:(?:ms|[smhdwy])(?:[0-9]+(?:ms|[smhdwy]))*)?`)
	varRE    = regexp.MustCompile(`^(?:\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*|\[\[[^\]]*\]\])`)
	punctRE  = regexp.MustCompile(`^(?:=~|!~|!=|==|<=|>=|[-+*/%^=<>(){}\[\],@:])`)
)

// lexPromQL splits a PromQL expression into tokens.
func lexPromQL(s string) ([]token, error) {
	var out []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#': // a comment, to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			var b strings.Builder
			j := i + 1
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' && c != '`' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string in %q", s)
			}
			out = append(out, token{tokString, b.String()})
			i = j + 1
		case varRE.MatchString(s[i:]):
			m := varRE.FindString(s[i:])
			out = append(out, token{tokVariable, m})
			i += len(m)
		case numberRE.MatchString(s[i:]) && (c >= '0' && c <= '9' || c == '.'):
			m := numberRE.FindString(s[i:])
			out = append(out, token{tokNumber, m})
			i += len(m)
		case identRE.MatchString(s[i:]):
			m := identRE.FindString(s[i:])
			out = append(out, token{tokIdent, m})
			i += len(m)
		case punctRE.MatchString(s[i:]):
			m := punctRE.FindString(s[i:])
			out = append(out, token{tokPunct, m})
			i += len(m)
		default:
			return nil, fmt.Errorf("unexpected %q at %d in %q", c, i, s)
		}
	}
	return out, nil
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (group, topic, partition) (kafka_consumergroup_group_lag)`, []string{"kafka_consumergroup_group_lag"}},
		{`max by (group) (kafka_consumergroup_group_lag_seconds) > 120`, []string{"kafka_consumergroup_group_lag_seconds"}},
		{`sum(rate(a_total{route="POST /v1/x",code=~"5.."}[5m])) by (route) / ignoring(code) group_left(route) sum(rate(b_total[5m] offset 1h))`,
			[]string{"a_total", "b_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket{job="onceflow"}[$__rate_interval])))`, []string{"x_seconds_bucket"}},
		{`{__name__="renamed_total", job="j"}`, []string{"renamed_total"}},
		{`label_replace(up{job="a"}, "dst", "$1", "src", "(.*)") and on (instance) absent(other_metric)`, []string{"other_metric", "up"}},
		{`topk(5, count_values("version", build_info)) * 1e3 + 0x1F - Inf`, []string{"build_info"}},
		{`max_over_time(rate(c_total[1m])[1h:5m]) @ end() unless c_total offset -5m`, []string{"c_total"}},
		{`sum without (instance) (g{l="by (x)"}) # sum(commented_out)`, []string{"g"}},
		{`avg(${metric_var}) or vector(0) > bool 1`, nil},
		{`group by (consumer) (g2) and group(g3)`, []string{"g2", "g3"}},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if len(got) == 0 && len(tc.want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{`{__name__=~"onceflow_.*"}`, `sum(x{a="b"`, `x"`, `rate(x[5m)`} {
		if got, err := metricNames(bad); err == nil {
			t.Errorf("%s: no error, got %v", bad, got)
		}
	}
}
