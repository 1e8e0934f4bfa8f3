const fs=require('fs');const html=fs.readFileSync(process.argv[2],'utf8');
const data=html.split('id="graph-data">')[1].split('</script>')[0];
const js=html.split('<script>')[1].split('</script>')[0];
function mk(tag){return {tag,children:[],dataset:{},className:'',value:'',textContent:'',style:{},
 appendChild(c){this.children.push(c);return c},replaceChildren(...c){this.children=c},
 addEventListener(){},querySelector(){return null},scrollIntoView(){}};}
const els={};for(const id of ['tree','info','results','q','filter','phase','gorc','collapse','title'])els[id]=mk('div');
els['filter'].value='all';
global.document={getElementById:(id)=>id==='graph-data'?{textContent:data}:els[id],createElement:mk};
eval(js);
const count=(e)=>1+e.children.reduce((a,c)=>a+count(c),0);
const all=count(els.tree);
els.filter.value="error";els.filter.onchange();const err=count(els.tree);
els.filter.value="unmatched";els.filter.onchange();const un=count(els.tree);
els.gorc.onclick();console.log(JSON.stringify({all,err,un,details:count(els.info)}));
