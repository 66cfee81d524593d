import traceback
async def handle(msg):
    from pyodide.ffi import to_js
    import js
    m = msg.to_py()
    try:
        ns = globals().setdefault("_ns", {})
        import ast
        tree = ast.parse(m["payload"])
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        code = compile(tree, "<exec>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        r = eval(code, ns)
        if r is not None and hasattr(r, "__await__"): await r
        res = None
        if last is not None:
            r = eval(compile(last, "<exec>", "eval", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), ns)
            if hasattr(r, "__await__"): r = await r
            res = repr(r)
        out = {"id": m["id"], "ok": True, "result": res}
    except BaseException as e:
        out = {"id": m["id"], "ok": False, "error": {"name": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}}
    return to_js(out, dict_converter=js.Object.fromEntries)
