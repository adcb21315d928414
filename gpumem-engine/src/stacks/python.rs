//! Python frames in a native stack: each `_PyEval_EvalFrameDefault` native
//! frame ran the Python frames from where the previous one stopped to its
//! entry frame; they take its place, innermost first. Python frames left
//! when no eval frame was unwound (a stack cut short) go at the end.
use std::sync::Arc;

use super::Frame;
use crate::python::code::PyFrame;

/// The interpreter's evaluation loop, by the name its symbols give it.
const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

pub fn interleave(natives: Vec<Frame>, py: &[PyFrame]) -> Vec<Frame> {
    let mut out = Vec::with_capacity(natives.len() + py.len());
    let mut rest = py.iter().peekable();
    for f in natives {
        if rest.peek().is_some() && f.function.as_deref().is_some_and(|n| n.starts_with(EVAL_FRAME)) {
            for p in rest.by_ref() {
                out.push(frame(p));
                if p.entry {
                    break;
                }
            }
            continue;
        }
        out.push(f);
    }
    out.extend(rest.map(frame));
    out
}

fn frame(p: &PyFrame) -> Frame {
    Frame {
        function: Some(p.function.clone()),
        offset: None,
        file: Some(p.file.clone()),
        line: p.line,
        module: Arc::from("python"),
        module_offset: 0,
        python: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str) -> Frame {
        Frame {
            function: Some(name.into()),
            offset: Some(1),
            file: None,
            line: None,
            module: Arc::from("/lib/x.so"),
            module_offset: 1,
            python: false,
        }
    }

    fn py(name: &str, entry: bool) -> PyFrame {
        PyFrame { function: name.into(), file: "train.py".into(), line: Some(3), entry }
    }

    #[test]
    fn python_frames_replace_the_eval_calls_that_ran_them() {
        // cuMemAlloc ← ffi_call ← eval(step ← main, entry) ← PyObject_Call ← eval(<module>, entry) ← main
        let natives = ["cuMemAlloc_v2", "ffi_call", "_PyEval_EvalFrameDefault", "PyObject_Call", "_PyEval_EvalFrameDefault", "main"];
        let frames = interleave(natives.iter().map(|n| native(n)).collect(), &[py("step", false), py("main", true), py("<module>", true)]);
        let names: Vec<&str> = frames.iter().map(|f| f.function.as_deref().unwrap()).collect();
        assert_eq!(names, ["cuMemAlloc_v2", "ffi_call", "step", "main", "PyObject_Call", "<module>", "main"]);
        assert!(frames[2].python && !frames[1].python);
        assert_eq!(frames[2].display(), "step (train.py:3) [python]");
        // No eval frame unwound: the Python frames at the end.
        let cut = interleave(vec![native("cuMemAlloc_v2")], &[py("step", true)]);
        assert_eq!(cut.iter().map(|f| f.function.as_deref().unwrap()).collect::<Vec<_>>(), ["cuMemAlloc_v2", "step"]);
    }
}
