package gitops

import (
	"context"
	"fmt"
	"time"

	lua "github.com/yuin/gopher-lua"
)

// Health is what an Argo CD health check returns.
type Health struct {
	Status  string
	Message string
}

// The health statuses Argo CD accepts from a Lua health check; anything else reads as Unknown.
var argoHealthStatuses = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true, "Degraded": true, "Missing": true,
}

// ArgoHealth runs a Lua health check on an object the way Argo CD does.
func ArgoHealth(obj map[string]interface{}, script string) (Health, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	// Argo CD opens only these (plus a restricted `os` this check does not use): no `string`,
	// `io` or `debug` library.
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return Health{}, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return Health{}, err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return Health{}, fmt.Errorf("expect table output from Lua script, not %s", l.Get(-1).Type())
	}
	var h Health
	switch s := ret.RawGetString("status").(type) {
	case lua.LString:
		h.Status = string(s)
	case *lua.LNilType:
	default:
		return Health{}, fmt.Errorf("hs.status is a %s, not a string", s.Type())
	}
	switch m := ret.RawGetString("message").(type) {
	case lua.LString:
		h.Message = string(m)
	case *lua.LNilType:
	default:
		return Health{}, fmt.Errorf("hs.message is a %s, not a string", m.Type())
	}
	if !argoHealthStatuses[h.Status] {
		return Health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return h, nil
}

// toLua converts a decoded Kubernetes object (as in unstructured.Unstructured.Object) into Lua
// values as Argo CD does: maps become hash tables, slices 1-based arrays, numbers LNumber.
func toLua(l *lua.LState, v interface{}) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case []interface{}:
		t := l.CreateTable(len(v), 0)
		for _, item := range v {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]interface{}:
		t := l.CreateTable(0, len(v))
		for key, item := range v {
			t.RawSetH(lua.LString(key), toLua(l, item))
		}
		return t
	}
	return lua.LNil
}
