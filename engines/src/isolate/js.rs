//! QuickJS functions that hold no state of an execution: how a value is shown as
//! text, and compiling module source to check it.

use rquickjs::{Coerced, Context, Ctx, Module, Runtime, Value};

/// How `console.log` prints a value: strings as they are, errors with their stack,
/// objects as JSON where possible, anything else through `String()`.
pub(super) fn show<'js>(ctx: &Ctx<'js>, v: &Value<'js>) -> String {
    if let Some(s) = v.as_string() {
        return s.to_string().unwrap_or_default();
    }
    if v.is_error() {
        return error_text(v);
    }
    if v.is_object() && !v.is_function() {
        if let Ok(Some(s)) = ctx.json_stringify(v.clone()) {
            if let Ok(s) = s.to_string() {
                return s;
            }
        }
        // A thrown toJSON or a cycle leaves an exception behind; drop it.
        let _ = ctx.catch();
    }
    coerce(ctx, v)
}

/// `String(v)`, or a placeholder when that throws.
pub(super) fn coerce<'js>(ctx: &Ctx<'js>, v: &Value<'js>) -> String {
    match v.get::<Coerced<String>>() {
        Ok(s) => s.0,
        Err(_) => {
            let _ = ctx.catch();
            format!("[{}]", v.type_name())
        }
    }
}

/// `String(error)` followed by its stack, as node prints an uncaught error.
pub(super) fn error_text(v: &Value<'_>) -> String {
    let head = v
        .get::<Coerced<String>>()
        .map(|s| s.0)
        .unwrap_or_else(|_| "Error".into());
    let stack = v
        .as_object()
        .and_then(|o| o.get::<_, Option<String>>("stack").ok().flatten())
        .unwrap_or_default();
    if stack.trim().is_empty() {
        head
    } else {
        format!("{head}\n{}", stack.trim_end())
    }
}

/// Compiles ES module source without running it; the error text when it does not
/// compile.
pub(super) fn compile_module(name: &str, source: &str) -> Result<(), String> {
    let rt = Runtime::new().map_err(|e| format!("creating a QuickJS runtime failed: {e}"))?;
    rt.set_memory_limit(64 << 20);
    rt.set_max_stack_size(1 << 20);
    let ctx = Context::full(&rt).map_err(|e| format!("creating a context failed: {e}"))?;
    ctx.with(|ctx| match Module::declare(ctx.clone(), name, source) {
        Ok(_) => Ok(()),
        Err(e) if e.is_exception() => {
            let thrown = ctx.catch();
            Err(show(&ctx, &thrown))
        }
        Err(e) => Err(e.to_string()),
    })
}
