// Command promqlnames says which metrics PromQL expressions read, parsed by Prometheus's own
// PromQL parser (the one promtool and the Prometheus server use), so that a test can check every
// query of a dashboard or a rule file against the metrics a program exports.
//
//	promqlnames < exprs.json
//
// Standard input is a JSON array of expressions; standard output is one JSON object per
// expression, in order: {"expr": ..., "names": [...], "error": ...}. A name is a selector's
// metric name (`foo{...}` or `{__name__="foo"}`); a selector that names no metric by equality
// yields "" so that the caller can refuse it. The exit status is 1 when an expression does not
// parse.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr  string   `json:"expr"`
	Names []string `json:"names"`
	Error string   `json:"error,omitempty"`
}

// metricName is the name a selector reads: its own or an equality matcher on __name__.
func metricName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

func names(p parser.Parser, expr string) result {
	parsed, err := p.ParseExpr(expr)
	if err != nil {
		return result{Expr: expr, Names: []string{}, Error: err.Error()}
	}
	seen := map[string]bool{}
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			seen[metricName(vs)] = true
		}
		return nil
	})
	found := make([]string, 0, len(seen))
	for name := range seen {
		found = append(found, name)
	}
	sort.Strings(found)
	return result{Expr: expr, Names: found}
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintf(os.Stderr, "promqlnames: standard input is not a JSON array of strings: %v\n", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	out := json.NewEncoder(os.Stdout)
	failed := false
	for _, expr := range exprs {
		r := names(p, expr)
		failed = failed || r.Error != ""
		if err := out.Encode(r); err != nil {
			fmt.Fprintf(os.Stderr, "promqlnames: %v\n", err)
			os.Exit(2)
		}
	}
	if failed {
		os.Exit(1)
	}
}
