package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// UnmarshalJSON decodes h as Caddy does, refusing fields it does not know,
// and names the field that one unknown is a typo of: a JSON config gets the
// "did you mean" that a Caddyfile gets.
func (h *Handler) UnmarshalJSON(b []byte) error {
	type plain Handler // the same fields, without this method
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode((*plain)(h)); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), `json: unknown field "`); ok {
			name = strings.TrimSuffix(name, `"`)
			return fmt.Errorf("%w%s", err, didYouMean(name, jsonFieldNames))
		}
		return err
	}
	return nil
}

// jsonFieldNames are the JSON names of the handler's config fields, its
// zones' and their parts': an unknown field may stand in any of them.
var jsonFieldNames = fieldNames(reflect.TypeFor[Handler](), nil)

// fieldNames adds the JSON names of t's fields, and of the structs they
// hold, to names.
func fieldNames(t reflect.Type, names []string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeFor[Handler]().PkgPath() {
		return names
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "" && f.Anonymous: // its fields are the struct's
			names = fieldNames(f.Type, names)
		case name != "" && name != "-" && !slices.Contains(names, name):
			names = fieldNames(f.Type, append(names, name))
		}
	}
	return names
}
