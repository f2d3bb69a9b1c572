// Command luahealth runs an Argo CD resource health check (Lua) against a table of fixtures
// the way Argo CD does, and says for each whether the result matches the expected one.
//
//	luahealth -script health.lua -tests health_test.yaml
//
// The tests file has the shape of Argo CD's own health_test.yaml:
//
//	tests:
//	- healthStatus: {status: Degraded, message: "..."}
//	  inputPath: testdata/failed.yaml
//
// Input paths are relative to the tests file. One JSON line per fixture goes to stdout
// (inputPath, expected, actual, error, ok); the exit status is 1 when any fixture does not match.
//
// The VM is set up like Argo CD's for scripts from argocd-cm (useOpenLibs false): only the
// package, base and table libraries are open, so a script that relies on `string` or `os`
// fails here as it would there; each run gets one second.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

// runTimeout is Argo CD's limit for one run of a resource customization script.
const runTimeout = time.Second

// validStatuses are the health status codes Argo CD accepts from a script; any other value
// is reported by Argo CD as Unknown.
var validStatuses = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true,
	"Suspended": true, "Missing": true, "Unknown": true,
}

// health is the table a health script returns.
type health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type testCase struct {
	HealthStatus health `json:"healthStatus"`
	InputPath    string `json:"inputPath"`
}

type testFile struct {
	Tests []testCase `json:"tests"`
}

type result struct {
	InputPath string  `json:"inputPath"`
	Expected  health  `json:"expected"`
	Actual    *health `json:"actual"`
	Error     string  `json:"error,omitempty"`
	OK        bool    `json:"ok"`
}

func main() {
	script := flag.String("script", "", "health check script (Lua)")
	tests := flag.String("tests", "", "fixture table in Argo CD's health_test.yaml shape")
	flag.Parse()
	if *script == "" || *tests == "" {
		fmt.Fprintln(os.Stderr, "usage: luahealth -script health.lua -tests health_test.yaml")
		os.Exit(2)
	}
	failed, err := run(*script, *tests)
	if err != nil {
		fmt.Fprintln(os.Stderr, "luahealth:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// run checks every fixture and prints its result; it reports whether any did not match.
func run(scriptPath, testsPath string) (bool, error) {
	source, err := os.ReadFile(scriptPath)
	if err != nil {
		return false, err
	}
	var table testFile
	if err := readYAML(testsPath, &table); err != nil {
		return false, err
	}
	if len(table.Tests) == 0 {
		return false, fmt.Errorf("%s lists no tests", testsPath)
	}
	out := json.NewEncoder(os.Stdout)
	failed := false
	for _, tc := range table.Tests {
		res := result{InputPath: tc.InputPath, Expected: tc.HealthStatus}
		var obj map[string]any
		err := readYAML(filepath.Join(filepath.Dir(testsPath), tc.InputPath), &obj)
		if err == nil {
			res.Actual, err = evaluate(string(source), obj)
		}
		if err != nil {
			res.Error = err.Error()
		}
		res.OK = err == nil && *res.Actual == tc.HealthStatus
		failed = failed || !res.OK
		if err := out.Encode(res); err != nil {
			return false, err
		}
	}
	return failed, nil
}

func readYAML(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// evaluate runs the script with the object as the global `obj` and reads the returned table.
func evaluate(source string, obj map[string]any) (*health, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for name, open := range map[string]lua.LGFunction{
		lua.LoadLibName: lua.OpenPackage,
		lua.BaseLibName: lua.OpenBase,
		lua.TabLibName:  lua.OpenTable,
	} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(open), Protect: true}, lua.LString(name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	L.SetContext(ctx)
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(source); err != nil {
		return nil, err
	}
	returned, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("the script returned %s, not a table", L.Get(-1).Type())
	}
	h := &health{Status: field(returned, "status"), Message: field(returned, "message")}
	if !validStatuses[h.Status] {
		return nil, errors.New("invalid health status " + h.Status)
	}
	return h, nil
}

// field is a string field of the returned table ("" when absent, as after Argo CD's JSON round trip).
func field(table *lua.LTable, key string) string {
	if value, ok := table.RawGetString(key).(lua.LString); ok {
		return string(value)
	}
	return ""
}

// toLua converts a decoded JSON value into Lua values: objects become tables keyed by
// string, arrays become sequences (1-based), numbers become Lua numbers, null becomes nil.
func toLua(L *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case map[string]any:
		table := L.CreateTable(0, len(v))
		for key, item := range v {
			table.RawSetString(key, toLua(L, item))
		}
		return table
	case []any:
		table := L.CreateTable(len(v), 0)
		for _, item := range v {
			table.Append(toLua(L, item))
		}
		return table
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	default:
		return lua.LNil
	}
}
