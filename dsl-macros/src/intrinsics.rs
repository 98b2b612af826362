//! The DSL's vocabulary: which calls a kernel may make and how their generic arguments work.

/// An intrinsic the macro rewrites to `::dsl_core::intrinsics::NAME(ctx, ...)`.
pub struct Intrinsic {
    /// Name as written in kernels.
    pub name: &'static str,
    /// Total generic parameters of the dsl-core function.
    pub generics: usize,
    /// Indices (among the user-written generic arguments) that are tile shapes and must be constant.
    pub shape_args: &'static [usize],
    /// Indices (among the user-written generic arguments) that are element types: a tile size
    /// written there is a mistake worth its own message.
    pub type_args: &'static [usize],
    /// How the call is written, for messages.
    pub usage: &'static str,
    /// Whether the intrinsic takes the context (false for pure scalar helpers like `cdiv`).
    pub takes_ctx: bool,
}

const fn i(name: &'static str, generics: usize, shape_args: &'static [usize]) -> Intrinsic {
    Intrinsic {
        name,
        generics,
        shape_args,
        type_args: &[],
        usage: "",
        takes_ctx: true,
    }
}

/// An intrinsic whose generic arguments authors write: shapes and element types are checked.
const fn typed(
    name: &'static str,
    generics: usize,
    shape_args: &'static [usize],
    type_args: &'static [usize],
    usage: &'static str,
) -> Intrinsic {
    Intrinsic {
        name,
        generics,
        shape_args,
        type_args,
        usage,
        takes_ctx: true,
    }
}

/// All intrinsics.
pub const INTRINSICS: &[Intrinsic] = &[
    i("program_id", 0, &[]),
    i("require", 0, &[]),
    i("num_programs", 0, &[]),
    Intrinsic {
        name: "cdiv",
        generics: 0,
        shape_args: &[],
        type_args: &[],
        usage: "",
        takes_ctx: false,
    },
    typed("load", 3, &[0, 1], &[2], "load::<R, C>(tensor, row, col)"),
    typed(
        "load_async",
        3,
        &[0, 1],
        &[2],
        "load_async::<R, C>(tensor, row, col)",
    ),
    typed(
        "load_or",
        3,
        &[0, 1],
        &[2],
        "load_or::<R, C>(tensor, row, col, fill)",
    ),
    typed(
        "load_async_or",
        3,
        &[0, 1],
        &[2],
        "load_async_or::<R, C>(tensor, row, col, fill)",
    ),
    i("store", 3, &[]),
    typed("full", 3, &[1, 2], &[0], "full::<f32, R, C>(value)"),
    typed("zeros", 3, &[1, 2], &[0], "zeros::<f32, R, C>()"),
    i("mma", 4, &[]),
    i("mma_bt", 4, &[]),
    typed("cast", 4, &[], &[0, 1], "cast::<f32>(&tile)"),
    i("exp", 3, &[]),
    i("ln", 3, &[]),
    i("sqrt", 3, &[]),
    i("rsqrt", 3, &[]),
    i("recip", 3, &[]),
    i("neg", 3, &[]),
    i("abs", 3, &[]),
    i("square", 3, &[]),
    i("relu", 3, &[]),
    i("sigmoid", 3, &[]),
    i("silu", 3, &[]),
    i("softplus", 3, &[]),
    i("add", 3, &[]),
    i("sub", 3, &[]),
    i("mul", 3, &[]),
    i("div", 3, &[]),
    i("maximum", 3, &[]),
    i("minimum", 3, &[]),
    i("scale", 3, &[]),
    i("add_scalar", 3, &[]),
    i("add_col", 3, &[]),
    i("sub_col", 3, &[]),
    i("mul_col", 3, &[]),
    i("div_col", 3, &[]),
    i("add_row", 3, &[]),
    i("sub_row", 3, &[]),
    i("mul_row", 3, &[]),
    i("div_row", 3, &[]),
    i("mask_keys", 3, &[]),
    i("mma_at", 4, &[]),
    i("transpose", 3, &[]),
    i("deinterleave", 4, &[]),
    i("interleave", 4, &[]),
    typed(
        "broadcast",
        3,
        &[1, 2],
        &[0],
        "broadcast::<_, R, C>(&scalar_tile)",
    ),
    i("tril", 3, &[]),
    typed("eye", 2, &[1], &[0], "eye::<f32, N>()"),
    i("load_index", 0, &[]),
    i("index_at", 2, &[]),
    i("topk_update", 2, &[]),
    i("gather_rows", 3, &[0, 1]),
    typed(
        "dequant_mxfp4",
        5,
        &[1, 2],
        &[0],
        "dequant_mxfp4::<bf16, R, C>(&blocks, &scales)",
    ),
    i("row_sum", 3, &[]),
    i("row_max", 3, &[]),
    i("col_sum", 3, &[]),
    i("col_max", 3, &[]),
];

/// Looks an intrinsic up by name.
pub fn find(name: &str) -> Option<&'static Intrinsic> {
    INTRINSICS.iter().find(|i| i.name == name)
}

/// Methods kernels may call on scalars and tensors (no data-dependent behaviour, no allocation).
pub const METHODS: &[&str] = &[
    "at",
    "rows_clipped",
    "cols_clipped",
    "rows",
    "cols",
    "shape",
    "len",
    "is_empty",
    "min",
    "max",
    "step_by",
    "rev",
    "sqrt",
    "powi",
    "powf",
    "abs",
    "exp",
    "ln",
    "saturating_sub",
    "div_ceil",
    "clamp",
    "recip",
];

/// Primitive types whose associated functions and constants kernels may use (`f32::NEG_INFINITY`,
/// `usize::min(a, b)`).
pub const PRIMITIVES: &[&str] = &["f32", "f64", "usize", "u32", "u64", "i32", "i64", "isize"];

/// A short list for error messages.
pub fn summary() -> String {
    "program_id, num_programs, require, cdiv, load, load_async, load_or, store, zeros, full, mma, mma_bt, cast, \
     exp/ln/sqrt/rsqrt/recip/neg/abs/square/relu/sigmoid/silu/softplus, add/sub/mul/div/maximum/minimum, \
     scale, add_scalar, {add,sub,mul,div}_{col,row}, row_sum/row_max/col_sum/col_max"
        .to_string()
}
